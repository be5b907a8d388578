//! What a trace returns: every way the packet can go, each with its chance, and questions
//! over all of them (which endpoints, masqueraded, dropped, rejected).

use crate::model::{Hook, Reject, TableRef, Values};
use std::collections::BTreeSet;
use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// How a packet's trip through the tables ends.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Fate {
    /// Through every hook: delivered to a local socket, or sent out.
    Accepted,
    Dropped,
    /// Dropped, and the sender told so.
    Rejected(Reject),
}

/// The source translation a packet's connection got.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Snat {
    /// To the address of the interface the packet leaves by (which routing picks, so the
    /// tracer does not know it).
    Masquerade { fully_random: bool },
    /// `snat to addr[:port]`.
    To(IpAddr, Option<u16>),
}

/// An exact probability: the product of the `numgen` draws a branch took.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Chance {
    num: u128,
    den: u128,
}

fn gcd(mut a: u128, mut b: u128) -> u128 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

impl Chance {
    pub const CERTAIN: Chance = Chance { num: 1, den: 1 };
    pub const NEVER: Chance = Chance { num: 0, den: 1 };

    /// `num / den`.
    ///
    /// # Panics
    /// `den` zero.
    pub fn of(num: u128, den: u128) -> Chance {
        assert!(den != 0, "a chance of {num}/0");
        let g = gcd(num, den).max(1);
        Chance {
            num: num / g,
            den: den / g,
        }
    }

    pub fn times(self, other: Chance) -> Chance {
        Chance::of(self.num * other.num, self.den * other.den)
    }

    pub fn plus(self, other: Chance) -> Chance {
        Chance::of(
            self.num * other.den + other.num * self.den,
            self.den * other.den,
        )
    }
}

impl fmt::Display for Chance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.num, self.den)
    }
}

/// One rule of one chain.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct RuleRef {
    pub table: TableRef,
    pub chain: String,
    /// The rule's place in its chain, from 0.
    pub index: usize,
}

impl fmt::Display for RuleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} chain {} rule {}", self.table, self.chain, self.index)
    }
}

/// A key a packet added to (or refreshed in) a dynamic set.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Learned {
    pub table: TableRef,
    pub set: String,
    pub key: Values,
}

/// One way the packet can go.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcome {
    pub fate: Fate,
    /// Where its connection was DNATed to: the endpoint's address and port.
    pub dnat: Option<SocketAddr>,
    pub snat: Option<Snat>,
    /// The named counters it counted into.
    pub counters: BTreeSet<String>,
    /// What it wrote into dynamic sets.
    pub learned: Vec<Learned>,
    /// The hooks it went through, in order.
    pub hooks: Vec<Hook>,
    /// The rules that matched (every statement passed, or a verdict taken), in order.
    pub rules: Vec<RuleRef>,
    pub chance: Chance,
}

impl Outcome {
    /// Accepted and handed to a socket on this host (its last hook is `input`).
    pub fn delivered_to_host(&self) -> bool {
        self.fate == Fate::Accepted && self.hooks.last() == Some(&Hook::Input)
    }

    /// Accepted with its source translated (masquerade or SNAT).
    pub fn masqueraded(&self) -> bool {
        self.fate == Fate::Accepted && self.snat.is_some()
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.fate {
            Fate::Accepted => f.write_str("accepted")?,
            Fate::Dropped => f.write_str("dropped")?,
            Fate::Rejected(r) => write!(f, "rejected ({r:?})")?,
        }
        if let Some(to) = self.dnat {
            write!(f, ", DNAT to {to}")?;
        }
        match self.snat {
            Some(Snat::Masquerade { fully_random }) => {
                let random = if fully_random { " fully-random" } else { "" };
                write!(f, ", masquerade{random}")?;
            }
            Some(Snat::To(a, p)) => write!(f, ", SNAT to {a}{}", port_text(p))?,
            None => {}
        }
        if self.delivered_to_host() {
            f.write_str(", to this host")?;
        }
        if !self.counters.is_empty() {
            let names: Vec<&str> = self.counters.iter().map(String::as_str).collect();
            write!(f, ", counted in {}", names.join(" "))?;
        }
        for l in &self.learned {
            write!(f, ", learned {:?} in {}", l.key, l.set)?;
        }
        let hooks: Vec<&str> = self.hooks.iter().map(|h| h.keyword()).collect();
        write!(f, " [{}; {}]", hooks.join(" > "), self.chance)
    }
}

fn port_text(p: Option<u16>) -> String {
    p.map(|p| format!(":{p}")).unwrap_or_default()
}

/// Every way a packet can go (more than one where `numgen` draws).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Outcomes(pub(crate) Vec<Outcome>);

impl Outcomes {
    pub fn iter(&self) -> std::slice::Iter<'_, Outcome> {
        self.0.iter()
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Where the accepted ways DNAT to.
    pub fn endpoints(&self) -> BTreeSet<SocketAddr> {
        self.accepted_ways().filter_map(|o| o.dnat).collect()
    }

    /// How the ways end.
    pub fn fates(&self) -> BTreeSet<Fate> {
        self.iter().map(|o| o.fate).collect()
    }

    /// Every way is accepted.
    pub fn accepted(&self) -> bool {
        self.fates() == BTreeSet::from([Fate::Accepted])
    }

    /// Every way is dropped (and no one is told).
    pub fn dropped(&self) -> bool {
        self.fates() == BTreeSet::from([Fate::Dropped])
    }

    /// How every way is rejected, when every way is rejected the same way.
    pub fn rejected(&self) -> Option<Reject> {
        match self.fates().into_iter().collect::<Vec<_>>()[..] {
            [Fate::Rejected(r)] => Some(r),
            _ => None,
        }
    }

    /// Every way is accepted with its source translated.
    pub fn masqueraded(&self) -> bool {
        !self.is_empty() && self.iter().all(Outcome::masqueraded)
    }

    /// Some way is accepted with its source translated.
    pub fn sometimes_masqueraded(&self) -> bool {
        self.iter().any(Outcome::masqueraded)
    }

    /// Every way is accepted and handed to a socket on this host, untranslated.
    pub fn delivered_to_host(&self) -> bool {
        !self.is_empty()
            && self
                .iter()
                .all(|o| o.delivered_to_host() && o.dnat.is_none())
    }

    /// The named counters any way counts into.
    pub fn counters(&self) -> BTreeSet<&str> {
        self.iter()
            .flat_map(|o| o.counters.iter().map(String::as_str))
            .collect()
    }

    /// The chance that the packet is accepted and DNATed to `endpoint`.
    pub fn chance_of(&self, endpoint: SocketAddr) -> Chance {
        self.accepted_ways()
            .filter(|o| o.dnat == Some(endpoint))
            .fold(Chance::NEVER, |c, o| c.plus(o.chance))
    }

    /// The way that DNATs to `endpoint`, when there is one.
    pub fn to(&self, endpoint: SocketAddr) -> Option<&Outcome> {
        self.accepted_ways().find(|o| o.dnat == Some(endpoint))
    }

    fn accepted_ways(&self) -> impl Iterator<Item = &Outcome> {
        self.iter().filter(|o| o.fate == Fate::Accepted)
    }
}

impl<'a> IntoIterator for &'a Outcomes {
    type Item = &'a Outcome;
    type IntoIter = std::slice::Iter<'a, Outcome>;

    fn into_iter(self) -> Self::IntoIter {
        self.iter()
    }
}

impl fmt::Display for Outcomes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for o in self.iter() {
            writeln!(f, "{o}")?;
        }
        Ok(())
    }
}
