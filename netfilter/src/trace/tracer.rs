//! The walk: which hooks a packet goes through, which base chains each hook runs and in what
//! order, and each chain's rules with its jumps, gotos and returns.

use super::branch::{Branch, Manip};
use super::error::{Problem, TraceError, JUMP_STACK, MAX_RULE_EVALUATIONS};
use super::eval::{Flow, Known, Scope};
use super::outcome::{Fate, Outcome, Outcomes, RuleRef};
use super::packet::{Address, CtState, Packet};
use crate::model::*;
use std::collections::{BTreeSet, VecDeque};
use std::net::IpAddr;

/// Traces packets through a host's tables.
///
/// ```
/// # use nodelb_netfilter::trace::{Packet, Tracer};
/// # use nodelb_netfilter::Table;
/// # let tables: Vec<Table> = Vec::new();
/// let tracer = Tracer::new(&tables).host(["192.0.2.1"]);
/// let out = tracer.trace(&Packet::tcp("203.0.113.9", "192.0.2.1", 443)).unwrap();
/// assert!(out.delivered_to_host());
/// ```
#[derive(Clone, Debug)]
pub struct Tracer<'t> {
    tables: Vec<&'t Table>,
    /// The host's own addresses: a packet for one of them goes to `input`, others are
    /// forwarded (kube-proxy's tracer takes the node's IPs for the same reason).
    host: BTreeSet<IpAddr>,
    known: Known,
}

/// What a hook runs, in order.
enum Step<'t> {
    Chain(&'t Table, &'t Chain),
    /// Every nat chain of the hook, run by the kernel's NAT at its own priority.
    Nat(Manip, Vec<(&'t Table, &'t Chain)>),
}

/// A rule's place, for errors and outcomes.
fn rule_ref(t: &Table, chain: &str, index: usize) -> RuleRef {
    RuleRef {
        table: TableRef::of(t),
        chain: chain.to_string(),
        index,
    }
}

impl<'t> Tracer<'t> {
    /// A tracer over `tables` (any families: a packet meets those of its own, and `inet`).
    pub fn new(tables: impl IntoIterator<Item = &'t Table>) -> Tracer<'t> {
        Tracer {
            tables: tables.into_iter().collect(),
            host: BTreeSet::new(),
            known: Known::new(),
        }
    }

    /// The host's addresses (loopback addresses are the host's without saying).
    pub fn host<A: Address>(mut self, addresses: impl IntoIterator<Item = A>) -> Tracer<'t> {
        self.host
            .extend(addresses.into_iter().map(Address::address));
        self
    }

    /// Dynamic set `set` of `table` holds `key` (a client ClientIP affinity remembers, say).
    pub fn knows(&mut self, table: &TableRef, set: &str, key: impl Into<Values>) {
        self.known
            .entry((table.clone(), set.to_string()))
            .or_default()
            .insert(key.into());
    }

    /// What `outcome` wrote into dynamic sets is there for the packets traced next: the
    /// kernel took that way.
    pub fn learn(&mut self, outcome: &Outcome) {
        for l in &outcome.learned {
            self.knows(&l.table, &l.set, l.key.clone());
        }
    }

    /// Every way `packet` can go through the tables.
    pub fn trace(&self, packet: &Packet) -> Result<Outcomes, TraceError> {
        let mut walk = Walk {
            tracer: self,
            left: MAX_RULE_EVALUATIONS,
        };
        let first = match packet.from_host {
            true => Hook::Output,
            false => Hook::Prerouting,
        };
        let mut work = VecDeque::from([(Branch::new(packet), first)]);
        let mut done = Vec::new();
        while let Some((b, hook)) = work.pop_front() {
            for (b, fate) in walk.hook(b, hook)? {
                match (fate, self.next_hook(&b, hook)) {
                    (None, Some(next)) => work.push_back((b, next)),
                    (None, None) => done.push(b.finish(Fate::Accepted)),
                    (Some(fate), _) => done.push(b.finish(fate)),
                }
            }
        }
        done.sort_by_key(|o| (o.fate, o.dnat));
        Ok(Outcomes(done))
    }

    fn local(&self, a: IpAddr) -> bool {
        a.is_loopback() || self.host.contains(&a)
    }

    /// Where routing sends the packet after `hook`; `None`: it has arrived (a local socket)
    /// or left (a link). A packet this host sends to itself leaves `postrouting` by the
    /// loopback device and comes back in through `prerouting`.
    fn next_hook(&self, b: &Branch, hook: Hook) -> Option<Hook> {
        match hook {
            Hook::Prerouting if self.local(b.dst) => Some(Hook::Input),
            Hook::Prerouting => Some(Hook::Forward),
            Hook::Forward | Hook::Output => Some(Hook::Postrouting),
            Hook::Postrouting if self.local(b.dst) => Some(Hook::Prerouting),
            Hook::Postrouting | Hook::Input => None,
        }
    }

    /// What `hook` runs for a packet of `family`: its filter (and route) base chains by
    /// priority, and where the kernel's NAT runs, its nat chains.
    fn steps(&self, hook: Hook, family: Family) -> Result<Vec<Step<'t>>, TraceError> {
        let mut filters = Vec::new();
        let mut nats = Vec::new();
        for t in self.tables.iter().copied() {
            if t.family != family && t.family != Family::Inet {
                continue;
            }
            for c in t.chains.values() {
                match c.base {
                    Some(b) if b.hook == hook && b.chain_type == ChainType::Nat => {
                        nats.push((b.priority, t, c))
                    }
                    Some(b) if b.hook == hook => filters.push((b.priority, t, c)),
                    _ => {}
                }
            }
        }
        filters.sort_by_key(|(p, ..)| *p);
        nats.sort_by_key(|(p, ..)| *p);
        let Some(manip) = Manip::of(hook) else {
            if let Some((_, t, c)) = nats.first() {
                let what = format!("nat chain {} on hook {}", c.name, hook.keyword());
                return Err(TraceError::Hooks {
                    table: TableRef::of(t),
                    what,
                });
            }
            return Ok(filters
                .into_iter()
                .map(|(_, t, c)| Step::Chain(t, c))
                .collect());
        };
        let at = manip.priority();
        if let Some((_, t, c)) = filters.iter().find(|(p, ..)| *p == at) {
            let what = format!(
                "base chain {} has the priority of the kernel's NAT on hook {} ({at}): which runs first depends on the order they were registered",
                c.name,
                hook.keyword()
            );
            return Err(TraceError::Hooks {
                table: TableRef::of(t),
                what,
            });
        }
        let nat = Step::Nat(manip, nats.into_iter().map(|(_, t, c)| (t, c)).collect());
        let (before, after): (Vec<_>, Vec<_>) = filters.into_iter().partition(|(p, ..)| *p < at);
        let chain = |(_, t, c): (i32, &'t Table, &'t Chain)| Step::Chain(t, c);
        let mut steps: Vec<Step<'t>> = before.into_iter().map(chain).collect();
        steps.push(nat);
        steps.extend(after.into_iter().map(chain));
        Ok(steps)
    }
}

/// One trace in progress: its budget of rule evaluations.
struct Walk<'a, 't> {
    tracer: &'a Tracer<'t>,
    left: usize,
}

/// A chain being run, and where to go on in it.
#[derive(Clone)]
struct Frame<'t> {
    chain: &'t Chain,
    next: usize,
}

/// Where a base chain sends a branch: on through the hook (`None`), or to its end.
type Ended = Vec<(Branch, Option<Fate>)>;

impl<'t> Walk<'_, 't> {
    /// Runs `hook`'s steps on `b`.
    fn hook(&mut self, mut b: Branch, hook: Hook) -> Result<Ended, TraceError> {
        let steps = self.tracer.steps(hook, b.family())?;
        b.hooks.push(hook);
        let mut work = vec![(b, 0)];
        let mut out = Vec::new();
        while let Some((b, i)) = work.pop() {
            let ended = match steps.get(i) {
                None => {
                    out.push((self.leave(b, hook), None));
                    continue;
                }
                Some(Step::Chain(t, c)) => self.base_chain(b, t, c)?,
                Some(Step::Nat(m, chains)) => self.nat(b, *m, chains)?,
            };
            for (b, fate) in ended {
                match fate {
                    None => work.push((b, i + 1)),
                    Some(f) => out.push((b, Some(f))),
                }
            }
        }
        Ok(out)
    }

    /// A new connection's first packet leaving `postrouting` confirms it.
    fn leave(&self, mut b: Branch, hook: Hook) -> Branch {
        if hook == Hook::Postrouting && b.state == CtState::New {
            b.confirm();
        }
        b
    }

    /// The kernel's NAT for one half of the connection: for a new connection whose half is
    /// not decided yet, its nat chains in order until one decides it; then the packet is
    /// rewritten as the connection's NAT says.
    fn nat(
        &mut self,
        b: Branch,
        m: Manip,
        chains: &[(&'t Table, &'t Chain)],
    ) -> Result<Ended, TraceError> {
        let runs = b.state == CtState::New && !b.bound(m);
        let mut work = vec![(b, if runs { 0 } else { chains.len() })];
        let mut out = Vec::new();
        while let Some((mut b, i)) = work.pop() {
            let Some((t, c)) = chains.get(i).filter(|_| !b.bound(m)) else {
                b.nat_done(m);
                out.push((b, None));
                continue;
            };
            for (b, fate) in self.base_chain(b, t, c)? {
                match fate {
                    None => work.push((b, i + 1)),
                    Some(f) => out.push((b, Some(f))),
                }
            }
        }
        Ok(out)
    }

    /// Runs base chain `c` of table `t`, with the chains it jumps and goes to.
    fn base_chain(&mut self, b: Branch, t: &'t Table, c: &'t Chain) -> Result<Ended, TraceError> {
        let base = c.base.expect("a base chain");
        let scope = Scope {
            table: t,
            table_ref: TableRef::of(t),
            hook: base.hook,
            chain_type: base.chain_type,
            known: &self.tracer.known,
        };
        let policy = match base.policy {
            Policy::Accept => None,
            Policy::Drop => Some(Fate::Dropped),
        };
        let mut work = vec![(b, vec![Frame { chain: c, next: 0 }])];
        let mut out = Vec::new();
        while let Some((b, mut stack)) = work.pop() {
            let top = stack.last_mut().expect("a chain runs");
            let Some(rule) = top.chain.rules.get(top.next) else {
                // The end of a chain returns to its caller; the base chain's, to its policy.
                stack.pop();
                match stack.is_empty() {
                    true => out.push((b, policy)),
                    false => work.push((b, stack)),
                }
                continue;
            };
            let at = rule_ref(t, &top.chain.name, top.next);
            top.next += 1;
            for (mut b, flow) in self.rule(&scope, b, rule, &at)? {
                if flow != Flow::Break {
                    b.rules.push(at.clone());
                }
                let mut stack = stack.clone();
                match follow(t, flow, &mut stack, &at)? {
                    Next::RunOn => work.push((b, stack)),
                    Next::Accept => out.push((b, None)),
                    Next::End(fate) => out.push((b, Some(fate))),
                    Next::Policy => out.push((b, policy)),
                }
            }
        }
        Ok(out)
    }

    /// One rule on one branch: its statements left to right.
    fn rule(
        &mut self,
        scope: &Scope<'_>,
        b: Branch,
        rule: &Rule,
        at: &RuleRef,
    ) -> Result<Vec<(Branch, Flow)>, TraceError> {
        self.left = self.left.checked_sub(1).ok_or(TraceError::TooLong)?;
        let mut work = vec![(b, 0)];
        let mut out = Vec::new();
        while let Some((b, i)) = work.pop() {
            let Some(stmt) = rule.stmts.get(i) else {
                out.push((b, Flow::Continue));
                continue;
            };
            for (b, flow) in scope.stmt(b, stmt).map_err(|p| p.at(at.clone()))? {
                match flow {
                    Flow::Continue => work.push((b, i + 1)),
                    end => out.push((b, end)),
                }
            }
        }
        Ok(out)
    }
}

/// Where a rule's flow takes the branch in its base chain.
enum Next {
    /// On through the chain stack (the next rule, a jump, a return to a caller).
    RunOn,
    /// Accepted: done with this base chain, on through the hook.
    Accept,
    End(Fate),
    /// Returned from the base chain itself: its policy.
    Policy,
}

/// What `flow` does to the chain stack of a branch in table `t`.
fn follow<'t>(
    t: &'t Table,
    flow: Flow,
    stack: &mut Vec<Frame<'t>>,
    at: &RuleRef,
) -> Result<Next, TraceError> {
    let invalid = |what: String| Problem::Invalid(what).at(at.clone());
    let target = |name: &str| match t.chains.get(name) {
        Some(c) if c.base.is_none() => Ok(c),
        Some(_) => Err(invalid(format!("jumps to base chain {name}"))),
        None => Err(invalid(format!("jumps to missing chain {name}"))),
    };
    Ok(match flow {
        Flow::Continue | Flow::Break => Next::RunOn,
        Flow::Reject(r) => Next::End(Fate::Rejected(r)),
        Flow::Verdict(Verdict::Accept) => Next::Accept,
        Flow::Verdict(Verdict::Drop) => Next::End(Fate::Dropped),
        Flow::Verdict(Verdict::Return) => {
            stack.pop();
            match stack.is_empty() {
                true => Next::Policy,
                false => Next::RunOn,
            }
        }
        Flow::Verdict(Verdict::Jump(name)) => {
            if stack.len() > JUMP_STACK {
                return Err(TraceError::JumpStack { at: at.clone() });
            }
            stack.push(Frame {
                chain: target(&name)?,
                next: 0,
            });
            Next::RunOn
        }
        Flow::Verdict(Verdict::Goto(name)) => {
            let chain = target(&name)?;
            // The called chain returns to this one's caller.
            stack.pop();
            stack.push(Frame { chain, next: 0 });
            Next::RunOn
        }
    })
}
