//! The structure says it by itself: rules of the code's shape that no reviewer has to keep
//! in mind, checked over every crate's sources.
//!
//! - No modules of a crate import each other, in a circle of any length (modules that need
//!   each other's words are one room cut in pieces, or share a fact that belongs to another).
//!   A submodule reaching its parent's items is how a room's parts share its words, and is not
//!   counted. Grouped imports (`use crate::{a::X, b::Y}`) count like single ones.
//! - No function over 80 lines outside tests.
//! - No struct in `agent/src/run/` but its `Settings` has more than 12 fields: the sync loop
//!   keeps an immutable context and a small state, not a bag of everything.
//!
//! The reading is lexical (comments and literals are blanked out first, then braces are
//! matched), which is exact for code `cargo fmt` formats.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const CRATES: [&str; 4] = ["netfilter", "core", "agent", "integration"];
const MAX_FN_LINES: usize = 80;
const MAX_RUN_FIELDS: usize = 12;

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("reading {}: {e}", dir.display())) {
        let p = e.expect("a directory entry").path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `code` with comments, string and char literals replaced by spaces (newlines kept), so that
/// braces and paths in them do not count.
fn blank(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    let keep = |c: u8| if c == b'\n' { b'\n' } else { b' ' };
    while i < b.len() {
        let rest = &b[i..];
        if rest.starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                out.push(b' ');
                i += 1;
            }
        } else if rest.starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    out.extend(b"  ");
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    out.extend(b"  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(keep(b[i]));
                    i += 1;
                }
            }
        } else if let Some((open, hashes)) = raw_string_start(rest)
            .filter(|_| i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            out.extend(std::iter::repeat_n(b' ', open));
            i += open;
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            while i < b.len() && !b[i..].starts_with(&close) {
                out.push(keep(b[i]));
                i += 1;
            }
            out.extend(std::iter::repeat_n(b' ', close.len().min(b.len() - i)));
            i += close.len();
        } else if b[i] == b'"' {
            out.push(b' ');
            i += 1;
            while i < b.len() && b[i] != b'"' {
                let n = if b[i] == b'\\' { 2 } else { 1 };
                for k in 0..n.min(b.len() - i) {
                    out.push(keep(b[i + k]));
                }
                i += n;
            }
            out.push(b' ');
            i += 1;
        } else if b[i] == b'\'' && char_literal_len(rest).is_some() {
            let n = char_literal_len(rest).expect("checked");
            out.extend(std::iter::repeat_n(b' ', n));
            i += n;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    out.truncate(b.len());
    String::from_utf8_lossy(&out).into_owned()
}

/// `r"`, `r#"`, `br##"` …: if a raw string starts here, the length of its opening and the
/// number of `#`s.
fn raw_string_start(s: &[u8]) -> Option<(usize, usize)> {
    let b = usize::from(s.first() == Some(&b'b'));
    let r = s.get(b..)?.strip_prefix(b"r")?;
    let hashes = r.iter().take_while(|c| **c == b'#').count();
    (r.get(hashes) == Some(&b'"')).then_some((b + 1 + hashes + 1, hashes))
}

/// The length of a char literal (`'a'`, `'\n'`, `'\u{1b}'`) starting here; `None` for a
/// lifetime.
fn char_literal_len(s: &[u8]) -> Option<usize> {
    if s.get(1) == Some(&b'\\') {
        let end = s[2..].iter().position(|c| *c == b'\'')?;
        return Some(end + 3);
    }
    let c = std::str::from_utf8(&s[1..s.len().min(6)])
        .ok()
        .or_else(|| std::str::from_utf8(&s[1..s.len().min(5)]).ok())
        .or_else(|| std::str::from_utf8(&s[1..s.len().min(4)]).ok())
        .or_else(|| std::str::from_utf8(&s[1..s.len().min(3)]).ok())?
        .chars()
        .next()?;
    (s.get(1 + c.len_utf8()) == Some(&b'\'')).then_some(2 + c.len_utf8())
}

/// The byte ranges of `#[cfg(test)]` items in blanked code (a test module, a test-only fn).
fn test_ranges(code: &str) -> Vec<(usize, usize)> {
    let mut out = Vec::new();
    let mut from = 0;
    while let Some(at) = code[from..].find("#[cfg(test)]") {
        let start = from + at;
        let Some(open) = code[start..].find('{').map(|o| start + o) else {
            break;
        };
        // `#[cfg(test)] mod tests;` names a file of its own: no body here.
        if code[start..open].contains(';') {
            from = start + 1;
            continue;
        }
        let end = matching(code, open);
        out.push((start, end));
        from = end;
    }
    out
}

/// The index just past the brace that closes the one at `open`.
fn matching(code: &str, open: usize) -> usize {
    let mut depth = 0;
    for (i, c) in code[open..].char_indices() {
        match c {
            '{' => depth += 1,
            '}' => {
                depth -= 1;
                if depth == 0 {
                    return open + i + 1;
                }
            }
            _ => {}
        }
    }
    code.len()
}

/// A crate's source files with their module paths (`plan::prepare`), test-only files left out.
fn modules(krate: &str) -> BTreeMap<Vec<String>, PathBuf> {
    let src = root().join(krate).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut out = BTreeMap::new();
    for f in files {
        let rel = f.strip_prefix(&src).expect("under src");
        let mut parts: Vec<String> = rel
            .with_extension("")
            .iter()
            .map(|p| p.to_string_lossy().into_owned())
            .collect();
        if parts.first().is_some_and(|p| p == "bin") || is_test_file(rel) {
            continue;
        }
        if matches!(
            parts.last().map(String::as_str),
            Some("mod" | "lib" | "main")
        ) {
            parts.pop();
        }
        out.insert(parts, f);
    }
    out
}

/// Files that are test modules of their own (`plan/tests/`, `status/tests_classes.rs`, the
/// status oracle) or test data (`fixtures.rs` or a `fixtures/` room, behind the `test-fixtures`
/// feature).
fn is_test_file(rel: &Path) -> bool {
    rel.iter().any(|p| {
        let p = p.to_string_lossy();
        p == "tests"
            || p.starts_with("tests.")
            || p.starts_with("tests_")
            || p == "oracle.rs"
            || p == "fixtures.rs"
            || p == "fixtures"
    })
}

/// `code` with every `use` tree flattened into one path a leaf (`use crate::{a::X, b::{Y,
/// self}};` becomes `use crate::a::X; use crate::b::Y; use crate::b;`), so that grouped
/// imports read like single ones.
fn flat_uses(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = find_word(rest, "use") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 3..];
        let end = after.find(';').unwrap_or(after.len());
        for path in use_leaves("", &after[..end]) {
            out.push_str(&format!("use {path};\n"));
        }
        rest = after.get(end + 1..).unwrap_or("");
    }
    out.push_str(rest);
    out
}

/// Where `word` starts in `code` as a whole word.
fn find_word(code: &str, word: &str) -> Option<usize> {
    let ident = |c: char| c.is_alphanumeric() || c == '_';
    let mut from = 0;
    while let Some(i) = code[from..].find(word) {
        let at = from + i;
        let before = code[..at].chars().next_back().is_some_and(ident);
        let after = code[at + word.len()..].chars().next().is_some_and(ident);
        if !before && !after {
            return Some(at);
        }
        from = at + word.len();
    }
    None
}

/// The leaves of a `use` tree below `prefix`, each as a whole path.
fn use_leaves(prefix: &str, tree: &str) -> Vec<String> {
    let tree = tree.trim();
    let join = |tail: &str| match (prefix.is_empty(), tail) {
        (true, _) => tail.to_string(),
        (false, "self") => prefix.to_string(),
        (false, _) => format!("{prefix}::{tail}"),
    };
    let Some(open) = tree.find('{') else {
        let path = tree.split(" as ").next().unwrap_or(tree).trim();
        return vec![join(&path.split_whitespace().collect::<String>())];
    };
    let head = tree[..open].trim().trim_end_matches("::").trim();
    let close = tree.rfind('}').unwrap_or(tree.len());
    let inner = &tree[open + 1..close];
    let base = if head.is_empty() {
        prefix.to_string()
    } else {
        join(&head.split_whitespace().collect::<String>())
    };
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0, 0);
    for (i, c) in inner.char_indices() {
        match c {
            '{' => depth += 1,
            '}' => depth -= 1,
            ',' if depth == 0 => {
                parts.push(&inner[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&inner[start..]);
    parts
        .into_iter()
        .filter(|p| !p.trim().is_empty())
        .flat_map(|p| use_leaves(&base, p))
        .collect()
}

/// Which modules `code` (of module `me`) reaches into, by path: `crate::a::b`, `super::x`,
/// and a parent's `use child::…`, grouped `use` trees included.
fn imports(me: &[String], code: &str, known: &BTreeSet<Vec<String>>) -> BTreeSet<Vec<String>> {
    let mut out = BTreeSet::new();
    let code = flat_uses(code);
    let words: Vec<&str> = code
        .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
        .filter(|w| w.contains("::"))
        .collect();
    for w in words {
        let mut segs: Vec<&str> = w.split("::").filter(|s| !s.is_empty()).collect();
        let base: Vec<String> = match segs.first() {
            Some(&"crate") => {
                segs.remove(0);
                Vec::new()
            }
            Some(&"super") => {
                let mut b = me.to_vec();
                while segs.first() == Some(&"super") {
                    segs.remove(0);
                    b.pop();
                }
                b
            }
            Some(&"self") => {
                segs.remove(0);
                me.to_vec()
            }
            Some(first) if known.contains(&[me, &[first.to_string()]].concat()) => me.to_vec(),
            _ => continue,
        };
        let mut path = base;
        let mut best = None;
        for s in segs {
            path.push(s.to_string());
            if known.contains(&path) {
                best = Some(path.clone());
            }
        }
        if let Some(target) = best.or_else(|| known.contains(&path).then_some(path)) {
            if target != me && !me.starts_with(&target) {
                out.insert(target);
            }
        }
    }
    out
}

/// The cycles of a module graph, one a strongly connected component of two modules or more
/// (Tarjan's algorithm), each given as a path that closes on its first module.
fn cycles(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Vec<Vec<Vec<String>>> {
    struct Walk<'g> {
        graph: &'g BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        index: BTreeMap<&'g Vec<String>, (usize, usize)>,
        stack: Vec<&'g Vec<String>>,
        components: Vec<Vec<&'g Vec<String>>>,
    }
    impl<'g> Walk<'g> {
        fn visit(&mut self, v: &'g Vec<String>) {
            let n = self.index.len();
            self.index.insert(v, (n, n));
            self.stack.push(v);
            for w in self.graph.get(v).into_iter().flatten() {
                let Some((w, _)) = self.graph.get_key_value(w) else {
                    continue;
                };
                match self.index.get(w).copied() {
                    None => {
                        self.visit(w);
                        let low = self.index[w].1.min(self.index[v].1);
                        self.index.get_mut(v).expect("visited").1 = low;
                    }
                    Some((wi, _)) if self.stack.contains(&w) => {
                        let low = wi.min(self.index[v].1);
                        self.index.get_mut(v).expect("visited").1 = low;
                    }
                    Some(_) => {}
                }
            }
            if self.index[v].0 == self.index[v].1 {
                let at = self
                    .stack
                    .iter()
                    .rposition(|x| *x == v)
                    .expect("on the stack");
                let component = self.stack.split_off(at);
                if component.len() > 1 {
                    self.components.push(component);
                }
            }
        }
    }
    let mut walk = Walk {
        graph,
        index: BTreeMap::new(),
        stack: Vec::new(),
        components: Vec::new(),
    };
    for v in graph.keys() {
        if !walk.index.contains_key(v) {
            walk.visit(v);
        }
    }
    walk.components
        .into_iter()
        .map(|c| cycle_through(graph, &c.into_iter().cloned().collect()))
        .collect()
}

/// A shortest path from the first module of `component` back to itself, inside it.
fn cycle_through(
    graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
    component: &BTreeSet<Vec<String>>,
) -> Vec<Vec<String>> {
    let start = component.iter().next().expect("a module").clone();
    let mut came_from: BTreeMap<Vec<String>, Vec<String>> = BTreeMap::new();
    let mut queue = std::collections::VecDeque::from([start.clone()]);
    while let Some(v) = queue.pop_front() {
        for w in graph.get(&v).into_iter().flatten() {
            if !component.contains(w) || came_from.contains_key(w) {
                continue;
            }
            came_from.insert(w.clone(), v.clone());
            if *w == start {
                queue.clear();
                break;
            }
            queue.push_back(w.clone());
        }
    }
    let mut path = vec![start.clone()];
    let mut at = came_from.get(&start).cloned();
    while let Some(v) = at {
        if v == start {
            break;
        }
        path.push(v.clone());
        at = came_from.get(&v).cloned();
    }
    path.push(start);
    path.reverse();
    path
}

fn without_tests(code: &str) -> String {
    let mut code = code.to_string();
    for (a, b) in test_ranges(&code).into_iter().rev() {
        code.replace_range(a..b, "");
    }
    code
}

#[test]
fn no_modules_import_each_other_in_a_circle() {
    let mut circles = Vec::new();
    for krate in CRATES {
        let mods = modules(krate);
        let known: BTreeSet<Vec<String>> = mods.keys().cloned().collect();
        let graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = mods
            .iter()
            .map(|(m, f)| {
                let text = std::fs::read_to_string(f).expect("a source file");
                (m.clone(), imports(m, &without_tests(&blank(&text)), &known))
            })
            .collect();
        for cycle in cycles(&graph) {
            let names: Vec<String> = cycle.iter().map(|m| m.join("::")).collect();
            circles.push(format!("{krate}: {}", names.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "modules that import each other, in a circle:\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_reading_sees_grouped_imports_and_cycles_of_three() {
    let known: BTreeSet<Vec<String>> = [["plan", "a"], ["plan", "b"], ["plan", "c"]]
        .iter()
        .map(|p| p.iter().map(|s| s.to_string()).collect())
        .collect();
    let me = |m: &str| vec!["plan".to_string(), m.to_string()];
    let code = "use crate::{\n    plan::{b::X, c::{self, Y}},\n    vocab::Z,\n};\nfn f() {}";
    assert_eq!(
        imports(&me("a"), code, &known),
        BTreeSet::from([me("b"), me("c")])
    );
    assert_eq!(
        imports(&me("a"), "use super::{b as bee, c::Y};", &known),
        BTreeSet::from([me("b"), me("c")])
    );
    let graph = BTreeMap::from([
        (me("a"), BTreeSet::from([me("b")])),
        (me("b"), BTreeSet::from([me("c")])),
        (me("c"), BTreeSet::from([me("a")])),
    ]);
    assert_eq!(
        cycles(&graph),
        vec![vec![me("a"), me("b"), me("c"), me("a")]]
    );
    let acyclic = BTreeMap::from([
        (me("a"), BTreeSet::from([me("b"), me("c")])),
        (me("b"), BTreeSet::from([me("c")])),
        (me("c"), BTreeSet::new()),
    ]);
    assert!(cycles(&acyclic).is_empty());
}

/// Every `fn` with a body in blanked, test-free code: (name, first line, lines).
fn functions(code: &str) -> Vec<(String, usize, usize)> {
    let mut out = Vec::new();
    let bytes = code.as_bytes();
    let mut from = 0;
    while let Some(at) = code[from..].find("fn ") {
        let start = from + at;
        from = start + 3;
        let word_start =
            start == 0 || !(bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        if !word_start {
            continue;
        }
        let name: String = code[start + 3..]
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_')
            .collect();
        if name.is_empty() {
            continue;
        }
        // The body's brace comes before any `;` (a declaration without a body ends at one).
        let Some(open) = code[start..].find(['{', ';']).map(|o| start + o) else {
            break;
        };
        if bytes[open] == b';' {
            continue;
        }
        let end = matching(code, open);
        let first = code[..start].matches('\n').count() + 1;
        let lines = code[start..end].lines().count();
        out.push((name, first, lines));
    }
    out
}

#[test]
fn no_function_over_80_lines_outside_tests() {
    let mut long = Vec::new();
    for krate in CRATES {
        for (_, f) in modules(krate) {
            let text = std::fs::read_to_string(&f).expect("a source file");
            for (name, line, lines) in functions(&without_tests(&blank(&text))) {
                if lines > MAX_FN_LINES {
                    let rel = f.strip_prefix(root()).unwrap_or(&f).display().to_string();
                    long.push(format!("{rel}:{line} fn {name}: {lines} lines"));
                }
            }
        }
    }
    assert!(
        long.is_empty(),
        "functions over {MAX_FN_LINES} lines:\n{}",
        long.join("\n")
    );
}

#[test]
fn no_struct_of_the_run_loop_but_its_settings_has_more_than_12_fields() {
    let dir = root().join("agent/src/run");
    let mut files = Vec::new();
    rust_files(&dir, &mut files);
    let mut big = Vec::new();
    for f in files {
        let code = without_tests(&blank(&std::fs::read_to_string(&f).expect("a source file")));
        let mut from = 0;
        while let Some(at) = code[from..].find("struct ") {
            let start = from + at;
            from = start + 7;
            let name: String = code[start + 7..]
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            let Some(open) = code[start..].find(['{', ';', '(']).map(|o| start + o) else {
                break;
            };
            if code.as_bytes()[open] != b'{' || name == "Settings" {
                continue;
            }
            let body = &code[open + 1..matching(&code, open) - 1];
            // Fields at the body's own depth: `name: Type,`.
            let mut depth = 0;
            let mut fields = 0;
            for line in body.lines() {
                let t = line.trim_start();
                if depth == 0
                    && t.split_once(':').is_some_and(|(n, _)| {
                        let n = n
                            .trim_start_matches("pub")
                            .trim_start_matches("(crate)")
                            .trim();
                        !n.is_empty() && n.chars().all(|c| c.is_alphanumeric() || c == '_')
                    })
                {
                    fields += 1;
                }
                depth += line.matches(['{', '(', '<', '[']).count() as i64;
                depth -= line.matches(['}', ')', '>', ']']).count() as i64;
                depth = depth.max(0);
            }
            if fields > MAX_RUN_FIELDS {
                big.push(format!("{} struct {name}: {fields} fields", f.display()));
            }
        }
    }
    assert!(
        big.is_empty(),
        "structs of run/ over {MAX_RUN_FIELDS} fields:\n{}",
        big.join("\n")
    );
}

/// The checks' own reading, on code made to trip each of them.
#[test]
fn the_checks_see_what_they_look_for() {
    let code = blank(
        "// fn not_code() {}\nfn a() { let s = \"}\"; let c = '}'; }\nfn b<'a>(x: &'a str) {\n}\n",
    );
    let f = functions(&code);
    assert_eq!(
        f,
        [("a".to_string(), 2, 1), ("b".to_string(), 3, 2)],
        "{code}"
    );
    let known: BTreeSet<Vec<String>> = [
        vec!["plan".into()],
        vec!["plan".into(), "flows".into()],
        vec!["plan".into(), "prepare".into()],
    ]
    .into_iter()
    .collect();
    let me = vec!["plan".to_string(), "prepare".to_string()];
    assert_eq!(
        imports(
            &me,
            &blank("use super::flows::Thing; // crate::status\n"),
            &known
        ),
        [vec!["plan".to_string(), "flows".to_string()]].into()
    );
    let tested = without_tests(&blank(
        "fn keep() {}\n#[cfg(test)]\nmod tests {\n fn gone() {}\n}\n",
    ));
    assert_eq!(functions(&tested).len(), 1, "{tested}");
}
