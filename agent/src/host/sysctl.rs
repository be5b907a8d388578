//! Forwarding sysctls through `/proc/sys`: `net.ipv4.ip_forward` and
//! `net.ipv6.conf.all.forwarding`. A missing IPv6 file means the host has no IPv6.

use nodelb_core::vocab::IpFamily;
use std::fmt;
use std::io;
use std::path::PathBuf;

/// Whether a family can forward.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forwarding {
    Forwarding,
    /// Forwarding is off; `fix` is the command that turns it on.
    Off {
        fix: String,
    },
    /// The family does not exist on this host (no IPv6).
    Absent,
}

impl fmt::Display for Forwarding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Forwarding::Forwarding => f.write_str("forwarding"),
            Forwarding::Off { fix } => write!(f, "forwarding is off (run `{fix}`)"),
            Forwarding::Absent => f.write_str("absent on this host"),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("reading sysctl {name}")]
    Read {
        name: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("sysctl {name} holds {value:?}, not a number")]
    NotANumber { name: &'static str, value: String },
    #[error("setting sysctl {name}")]
    Write {
        name: &'static str,
        #[source]
        source: io::Error,
    },
}

/// The sysctl tree, normally `/proc/sys`; tests point it at a directory of their own.
#[derive(Clone, Debug)]
pub struct Sysctls {
    root: PathBuf,
}

impl Default for Sysctls {
    fn default() -> Sysctls {
        Sysctls::new("/proc/sys")
    }
}

/// The forwarding sysctl of a family, dotted.
pub fn forwarding_name(family: IpFamily) -> &'static str {
    match family {
        IpFamily::V4 => "net.ipv4.ip_forward",
        IpFamily::V6 => "net.ipv6.conf.all.forwarding",
    }
}

const ACCEPT_RA: [&str; 2] = [
    "net.ipv6.conf.all.accept_ra",
    "net.ipv6.conf.default.accept_ra",
];

impl Sysctls {
    pub fn new(root: impl Into<PathBuf>) -> Sysctls {
        Sysctls { root: root.into() }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.root.join(name.replace('.', "/"))
    }

    /// A numeric sysctl, or `None` when the file does not exist.
    pub fn read(&self, name: &'static str) -> Result<Option<i64>, Error> {
        match std::fs::read_to_string(self.path(name)) {
            Ok(s) => s.trim().parse().map(Some).map_err(|_| Error::NotANumber {
                name,
                value: s.trim().to_string(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
            Err(source) => Err(Error::Read { name, source }),
        }
    }

    fn write(&self, name: &'static str, value: i64) -> Result<(), Error> {
        std::fs::write(self.path(name), format!("{value}\n"))
            .map_err(|source| Error::Write { name, source })
    }

    /// The ports the kernel picks for outgoing connections and unbound sends
    /// (`net.ipv4.ip_local_port_range`, both families), or `None` when the file does not
    /// exist.
    pub fn ephemeral_ports(&self) -> Result<Option<std::ops::RangeInclusive<u16>>, Error> {
        const NAME: &str = "net.ipv4.ip_local_port_range";
        let text = match std::fs::read_to_string(self.path(NAME)) {
            Ok(t) => t,
            Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(Error::Read { name: NAME, source }),
        };
        let bad = || Error::NotANumber {
            name: NAME,
            value: text.trim().to_string(),
        };
        let mut ports = text.split_whitespace().map(|p| p.parse::<u16>());
        match (ports.next(), ports.next(), ports.next()) {
            (Some(Ok(low)), Some(Ok(high)), None) if low <= high => Ok(Some(low..=high)),
            _ => Err(bad()),
        }
    }

    /// Whether `family` forwards.
    pub fn forwarding(&self, family: IpFamily) -> Result<Forwarding, Error> {
        let name = forwarding_name(family);
        Ok(match self.read(name)? {
            None => Forwarding::Absent,
            Some(v) if v != 0 => Forwarding::Forwarding,
            Some(_) => Forwarding::Off {
                fix: format!("sysctl -w {name}=1"),
            },
        })
    }

    /// Turn forwarding on for `family` (nothing is written when it is already on). Returns the
    /// state afterwards and, for IPv6, warnings about router advertisements no longer being
    /// accepted.
    pub fn enable_forwarding(&self, family: IpFamily) -> Result<(Forwarding, Vec<String>), Error> {
        match self.forwarding(family)? {
            Forwarding::Off { .. } => {}
            other => return Ok((other, Vec::new())),
        }
        self.write(forwarding_name(family), 1)?;
        let warnings = match family {
            IpFamily::V4 => Vec::new(),
            IpFamily::V6 => self.accept_ra_warnings()?,
        };
        Ok((self.forwarding(family)?, warnings))
    }

    /// With IPv6 forwarding on, the kernel accepts router advertisements only where
    /// `accept_ra` is 2: one warning per `all`/`default` setting below 2.
    pub fn accept_ra_warnings(&self) -> Result<Vec<String>, Error> {
        let mut out = Vec::new();
        for name in ACCEPT_RA {
            if let Some(v) = self.read(name)? {
                if v != 2 {
                    out.push(format!(
                        "{name} is {v}: with IPv6 forwarding on, router advertisements are no \
                         longer accepted; if this host configures IPv6 from them, run \
                         `sysctl -w {name}=2` (and for the interface that receives them)"
                    ));
                }
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct TempRoot(PathBuf);

    impl TempRoot {
        fn new(tag: &str) -> TempRoot {
            static N: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
            let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let p = std::env::temp_dir()
                .join(format!("nodelb-sysctl-{}-{n}-{tag}", std::process::id()));
            std::fs::create_dir_all(&p).unwrap();
            TempRoot(p)
        }
        fn set(&self, name: &str, v: &str) {
            let p = self.0.join(name.replace('.', "/"));
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, v).unwrap();
        }
        fn get(&self, name: &str) -> String {
            std::fs::read_to_string(self.0.join(name.replace('.', "/"))).unwrap()
        }
    }

    impl Drop for TempRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }

    #[test]
    fn reads_each_family_and_spells_the_fix() {
        let root = TempRoot::new("read");
        root.set("net.ipv4.ip_forward", "1\n");
        root.set("net.ipv6.conf.all.forwarding", "0\n");
        let s = Sysctls::new(&root.0);
        assert_eq!(s.forwarding(IpFamily::V4).unwrap(), Forwarding::Forwarding);
        assert_eq!(
            s.forwarding(IpFamily::V6).unwrap(),
            Forwarding::Off {
                fix: "sysctl -w net.ipv6.conf.all.forwarding=1".into()
            }
        );
    }

    #[test]
    fn reads_the_ephemeral_port_range() {
        let root = TempRoot::new("ephemeral");
        let s = Sysctls::new(&root.0);
        assert_eq!(s.ephemeral_ports().unwrap(), None);
        root.set("net.ipv4.ip_local_port_range", "32768\t60999\n");
        assert_eq!(s.ephemeral_ports().unwrap(), Some(32768..=60999));
        root.set("net.ipv4.ip_local_port_range", "60999 32768\n");
        assert!(s.ephemeral_ports().is_err());
    }

    #[test]
    fn missing_ipv6_file_means_ipv6_is_absent() {
        let root = TempRoot::new("absent");
        root.set("net.ipv4.ip_forward", "0");
        let s = Sysctls::new(&root.0);
        assert_eq!(s.forwarding(IpFamily::V6).unwrap(), Forwarding::Absent);
        assert!(matches!(
            s.forwarding(IpFamily::V4).unwrap(),
            Forwarding::Off { .. }
        ));
        // Absent stays absent: nothing to turn on, nothing written.
        assert_eq!(
            s.enable_forwarding(IpFamily::V6).unwrap().0,
            Forwarding::Absent
        );
        assert!(!root.0.join("net/ipv6").exists());
    }

    #[test]
    fn garbage_is_an_error_naming_the_sysctl() {
        let root = TempRoot::new("garbage");
        root.set("net.ipv4.ip_forward", "yes");
        let e = Sysctls::new(&root.0).forwarding(IpFamily::V4).unwrap_err();
        assert_eq!(
            e.to_string(),
            "sysctl net.ipv4.ip_forward holds \"yes\", not a number"
        );
    }

    #[test]
    fn enabling_ipv6_warns_about_router_advertisements_unless_accept_ra_is_2() {
        let root = TempRoot::new("ra");
        root.set("net.ipv6.conf.all.forwarding", "0");
        root.set("net.ipv6.conf.all.accept_ra", "1");
        root.set("net.ipv6.conf.default.accept_ra", "2");
        let s = Sysctls::new(&root.0);
        let (state, warnings) = s.enable_forwarding(IpFamily::V6).unwrap();
        assert_eq!(state, Forwarding::Forwarding);
        assert_eq!(root.get("net.ipv6.conf.all.forwarding").trim(), "1");
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].starts_with("net.ipv6.conf.all.accept_ra is 1"));
        assert!(warnings[0].contains("sysctl -w net.ipv6.conf.all.accept_ra=2"));
        // Already on: nothing written, no warning repeated.
        assert!(s.enable_forwarding(IpFamily::V6).unwrap().1.is_empty());
    }

    #[test]
    fn enabling_ipv4_writes_one() {
        let root = TempRoot::new("v4");
        root.set("net.ipv4.ip_forward", "0");
        let s = Sysctls::new(&root.0);
        let (state, warnings) = s.enable_forwarding(IpFamily::V4).unwrap();
        assert_eq!(state, Forwarding::Forwarding);
        assert!(warnings.is_empty());
        assert_eq!(root.get("net.ipv4.ip_forward"), "1\n");
    }
}
