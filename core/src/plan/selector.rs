//! Kubernetes label selectors in their string form, for the `nodelb.io/node-selector`
//! annotation: `k=v`, `k==v`, `k!=v`, `k`, `!k`, `k in (a,b)`, `k notin (a,b)`, `k>n`, `k<n`,
//! joined with commas (AND). The empty selector matches every node.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Selector(Vec<Requirement>);

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Op,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Op {
    Exists,
    DoesNotExist,
    Equals(String),
    NotEquals(String),
    In(BTreeSet<String>),
    NotIn(BTreeSet<String>),
    GreaterThan(i64),
    LessThan(i64),
}

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("at character {at}: {message}")]
pub struct SelectorError {
    /// Character offset into the selector where the problem was found.
    pub at: usize,
    pub message: String,
}

impl Selector {
    pub fn parse(s: &str) -> Result<Selector, SelectorError> {
        Parser {
            tokens: lex(s)?,
            pos: 0,
            end: s.chars().count(),
        }
        .selector()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.0
    }

    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.0.iter().all(|r| r.matches(labels))
    }
}

impl Requirement {
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match &self.op {
            Op::Exists => value.is_some(),
            Op::DoesNotExist => value.is_none(),
            Op::Equals(v) => value == Some(v),
            Op::NotEquals(v) => value != Some(v),
            Op::In(vs) => value.is_some_and(|v| vs.contains(v)),
            Op::NotIn(vs) => !value.is_some_and(|v| vs.contains(v)),
            Op::GreaterThan(n) => value
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v > *n),
            Op::LessThan(n) => value
                .and_then(|v| v.parse::<i64>().ok())
                .is_some_and(|v| v < *n),
        }
    }
}

impl fmt::Display for Selector {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, r) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            let k = &r.key;
            let list = |vs: &BTreeSet<String>| vs.iter().cloned().collect::<Vec<_>>().join(",");
            match &r.op {
                Op::Exists => write!(f, "{k}")?,
                Op::DoesNotExist => write!(f, "!{k}")?,
                Op::Equals(v) => write!(f, "{k}={v}")?,
                Op::NotEquals(v) => write!(f, "{k}!={v}")?,
                Op::In(vs) => write!(f, "{k} in ({})", list(vs))?,
                Op::NotIn(vs) => write!(f, "{k} notin ({})", list(vs))?,
                Op::GreaterThan(n) => write!(f, "{k}>{n}")?,
                Op::LessThan(n) => write!(f, "{k}<{n}")?,
            }
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum Tok {
    Ident(String),
    Not,   // !
    Eq,    // = or ==
    NotEq, // !=
    Gt,    // >
    Lt,    // <
    Comma, // ,
    Open,  // (
    Close, // )
}

fn lex(s: &str) -> Result<Vec<(usize, Tok)>, SelectorError> {
    let chars: Vec<char> = s.chars().collect();
    let mut out = Vec::new();
    let mut i = 0;
    let special = |c: char| matches!(c, '!' | '=' | '>' | '<' | ',' | '(' | ')');
    while i < chars.len() {
        let c = chars[i];
        let at = i;
        if c.is_whitespace() {
            i += 1;
            continue;
        }
        let tok = match c {
            '!' if chars.get(i + 1) == Some(&'=') => {
                i += 2;
                Tok::NotEq
            }
            '!' => {
                i += 1;
                Tok::Not
            }
            '=' if chars.get(i + 1) == Some(&'=') => {
                i += 2;
                Tok::Eq
            }
            '=' => {
                i += 1;
                Tok::Eq
            }
            '>' => {
                i += 1;
                Tok::Gt
            }
            '<' => {
                i += 1;
                Tok::Lt
            }
            ',' => {
                i += 1;
                Tok::Comma
            }
            '(' => {
                i += 1;
                Tok::Open
            }
            ')' => {
                i += 1;
                Tok::Close
            }
            _ => {
                let start = i;
                while i < chars.len() && !chars[i].is_whitespace() && !special(chars[i]) {
                    i += 1;
                }
                Tok::Ident(chars[start..i].iter().collect())
            }
        };
        out.push((at, tok));
    }
    Ok(out)
}

struct Parser {
    tokens: Vec<(usize, Tok)>,
    pos: usize,
    end: usize,
}

impl Parser {
    fn peek(&self) -> Option<&Tok> {
        self.tokens.get(self.pos).map(|(_, t)| t)
    }

    fn at(&self) -> usize {
        self.tokens.get(self.pos).map_or(self.end, |(a, _)| *a)
    }

    fn err<T>(&self, message: impl Into<String>) -> Result<T, SelectorError> {
        Err(SelectorError {
            at: self.at(),
            message: message.into(),
        })
    }

    fn next(&mut self) -> Option<Tok> {
        let t = self.tokens.get(self.pos).map(|(_, t)| t.clone());
        self.pos += 1;
        t
    }

    fn selector(mut self) -> Result<Selector, SelectorError> {
        let mut reqs = Vec::new();
        if self.peek().is_none() {
            return Ok(Selector(reqs));
        }
        loop {
            reqs.push(self.requirement()?);
            match self.peek() {
                None => return Ok(Selector(reqs)),
                Some(Tok::Comma) => {
                    self.pos += 1;
                    if self.peek().is_none() {
                        return self.err("expected a requirement after ','");
                    }
                }
                Some(_) => return self.err("expected ',' or the end of the selector"),
            }
        }
    }

    fn key(&mut self) -> Result<String, SelectorError> {
        match self.peek() {
            Some(Tok::Ident(k)) if k != "in" && k != "notin" => {
                let k = k.clone();
                if let Err(e) = validate_key(&k) {
                    return self.err(format!("invalid label key {k:?}: {e}"));
                }
                self.pos += 1;
                Ok(k)
            }
            _ => self.err("expected a label key"),
        }
    }

    fn requirement(&mut self) -> Result<Requirement, SelectorError> {
        if self.peek() == Some(&Tok::Not) {
            self.pos += 1;
            let key = self.key()?;
            return Ok(Requirement {
                key,
                op: Op::DoesNotExist,
            });
        }
        let key = self.key()?;
        let op = match self.peek() {
            None | Some(Tok::Comma) => Op::Exists,
            Some(Tok::Eq) => {
                self.pos += 1;
                Op::Equals(self.single_value()?)
            }
            Some(Tok::NotEq) => {
                self.pos += 1;
                Op::NotEquals(self.single_value()?)
            }
            Some(Tok::Gt) | Some(Tok::Lt) => {
                let gt = self.next() == Some(Tok::Gt);
                let v = self.single_value()?;
                let Ok(n) = v.parse::<i64>() else {
                    return self.err(format!("{v:?} is not an integer"));
                };
                if gt {
                    Op::GreaterThan(n)
                } else {
                    Op::LessThan(n)
                }
            }
            Some(Tok::Ident(w)) if w == "in" || w == "notin" => {
                let notin = w == "notin";
                self.pos += 1;
                let values = self.value_set()?;
                if notin {
                    Op::NotIn(values)
                } else {
                    Op::In(values)
                }
            }
            Some(_) => return self.err("expected an operator (=, ==, !=, in, notin, >, <)"),
        };
        Ok(Requirement { key, op })
    }

    /// A value after `=`, `==`, `!=`: may be empty (`k=` selects the empty value).
    fn single_value(&mut self) -> Result<String, SelectorError> {
        match self.peek() {
            None | Some(Tok::Comma) => Ok(String::new()),
            Some(Tok::Ident(v)) => {
                let v = v.clone();
                if let Err(e) = validate_value(&v) {
                    return self.err(format!("invalid label value {v:?}: {e}"));
                }
                self.pos += 1;
                Ok(v)
            }
            Some(_) => self.err("expected a label value"),
        }
    }

    /// `( a, b, )`: values may be empty.
    fn value_set(&mut self) -> Result<BTreeSet<String>, SelectorError> {
        if self.next() != Some(Tok::Open) {
            self.pos -= 1;
            return self.err("expected '(' after in/notin");
        }
        let mut values = BTreeSet::new();
        loop {
            let v = match self.peek() {
                Some(Tok::Ident(v)) => {
                    let v = v.clone();
                    if let Err(e) = validate_value(&v) {
                        return self.err(format!("invalid label value {v:?}: {e}"));
                    }
                    self.pos += 1;
                    v
                }
                Some(Tok::Comma) | Some(Tok::Close) => String::new(),
                _ => return self.err("expected a value, ',' or ')'"),
            };
            values.insert(v);
            match self.next() {
                Some(Tok::Comma) => continue,
                Some(Tok::Close) => return Ok(values),
                _ => {
                    self.pos -= 1;
                    return self.err("expected ',' or ')'");
                }
            }
        }
    }
}

/// A label name part: at most 63 characters, alphanumeric at both ends, `-_.` inside.
fn validate_name(s: &str) -> Result<(), String> {
    if s.is_empty() {
        return Err("name part must not be empty".into());
    }
    if s.len() > 63 {
        return Err("name part must be at most 63 characters".into());
    }
    let ok_end = |c: char| c.is_ascii_alphanumeric();
    let ok_mid = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.');
    let first = s.chars().next().expect("not empty");
    let last = s.chars().last().expect("not empty");
    if !ok_end(first) || !ok_end(last) || !s.chars().all(ok_mid) {
        return Err(
            "must be alphanumeric, '-', '_' or '.', starting and ending alphanumeric".into(),
        );
    }
    Ok(())
}

/// A label key: `[prefix/]name`, the prefix a DNS subdomain.
fn validate_key(k: &str) -> Result<(), String> {
    let name = match k.split_once('/') {
        Some((prefix, name)) => {
            let ok = !prefix.is_empty()
                && prefix.len() <= 253
                && prefix.split('.').all(|l| {
                    !l.is_empty()
                        && l.len() <= 63
                        && l.chars()
                            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
                        && !l.starts_with('-')
                        && !l.ends_with('-')
                });
            if !ok {
                return Err(format!("prefix {prefix:?} is not a DNS subdomain"));
            }
            name
        }
        None => k,
    };
    validate_name(name)
}

fn validate_value(v: &str) -> Result<(), String> {
    if v.is_empty() {
        Ok(())
    } else {
        validate_name(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    fn m(sel: &str, l: &[(&str, &str)]) -> bool {
        Selector::parse(sel)
            .unwrap_or_else(|e| panic!("{sel:?}: {e}"))
            .matches(&labels(l))
    }

    #[test]
    fn equality_operators_match_like_kubernetes() {
        assert!(m("pool=edge", &[("pool", "edge")]));
        assert!(m("pool==edge", &[("pool", "edge")]));
        assert!(!m("pool=edge", &[("pool", "core")]));
        assert!(!m("pool=edge", &[]));
        assert!(m("pool!=edge", &[("pool", "core")]));
        assert!(m("pool!=edge", &[]), "!= matches nodes without the label");
        assert!(!m("pool!=edge", &[("pool", "edge")]));
        assert!(m("pool=", &[("pool", "")]));
        assert!(!m("pool=", &[("pool", "x")]));
    }

    #[test]
    fn existence_and_set_operators_match_like_kubernetes() {
        assert!(m("edge", &[("edge", "")]));
        assert!(!m("edge", &[]));
        assert!(m("!edge", &[]));
        assert!(!m("!edge", &[("edge", "true")]));
        assert!(m("zone in (a, b)", &[("zone", "b")]));
        assert!(!m("zone in (a,b)", &[("zone", "c")]));
        assert!(!m("zone in (a,b)", &[]));
        assert!(m("zone notin (a,b)", &[("zone", "c")]));
        assert!(
            m("zone notin (a,b)", &[]),
            "notin matches nodes without the label"
        );
        assert!(!m("zone notin (a,b)", &[("zone", "a")]));
        assert!(m("gen>3", &[("gen", "4")]));
        assert!(!m("gen>3", &[("gen", "3")]));
        assert!(!m("gen>3", &[("gen", "x")]));
        assert!(m("gen<3", &[("gen", "2")]));
    }

    #[test]
    fn commas_join_requirements_with_and() {
        let sel = "example.com/pool=edge, !node-role.kubernetes.io/control-plane,zone in (a,b)";
        assert!(m(sel, &[("example.com/pool", "edge"), ("zone", "a")]));
        assert!(!m(
            sel,
            &[
                ("example.com/pool", "edge"),
                ("zone", "a"),
                ("node-role.kubernetes.io/control-plane", "")
            ]
        ));
        assert!(!m(sel, &[("example.com/pool", "edge"), ("zone", "c")]));
        assert_eq!(
            Selector::parse(sel).unwrap().to_string(),
            "example.com/pool=edge,!node-role.kubernetes.io/control-plane,zone in (a,b)"
        );
    }

    #[test]
    fn empty_selector_matches_everything() {
        assert!(m("", &[]));
        assert!(m("  ", &[("a", "b")]));
    }

    #[test]
    fn invalid_selectors_are_errors_with_a_position() {
        for bad in [
            "pool=edge,",
            ",pool",
            "pool=edge=x",
            "pool in a,b",
            "pool in (a,b",
            "in (a)",
            "pool === edge",
            "pool=-bad",
            "-pool",
            "Bad_Prefix/x=y",
            "gen>x",
            "!",
            "a b",
            "pool notin",
        ] {
            assert!(Selector::parse(bad).is_err(), "{bad:?} should not parse");
        }
        let e = Selector::parse("pool=edge,,zone").unwrap_err();
        assert_eq!(e.at, 10, "{e}");
    }
}
