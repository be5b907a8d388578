//! `render` and `apply`: plan once for objects read from files and this node described by
//! flags; print the nft script, or program it.

use crate::cli::FileArgs;
use crate::object_files::{self, ObjectFiles};
use nodelb_core::plan::config::Config;
use nodelb_core::plan::node::{AddressKind, NodeInfo};
use nodelb_core::plan::reserved::DEFAULT_OWN_PORTS;
use nodelb_core::plan::{self, Input, Plan};
use nodelb_core::vocab::{Families, IpFamily};
use nodelb_netfilter::{Commit, CommitStats, Committer, Nft, TableRef};
use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

/// Everything a one-shot plan looks at.
pub struct OneShot {
    pub objects: ObjectFiles,
    pub node: NodeInfo,
    pub local_addresses: BTreeSet<IpAddr>,
    pub families: Families,
    pub config: Config,
}

impl OneShot {
    pub fn load(args: &FileArgs) -> Result<OneShot, object_files::Error> {
        let objects = ObjectFiles::read(&args.files)?;
        Ok(OneShot::new(objects, args))
    }

    pub fn new(objects: ObjectFiles, args: &FileArgs) -> OneShot {
        let node = node_info(&objects, args);
        // The agent's default health and metrics ports: reserved as `run` would with default flags.
        let config = args.planner.config(&DEFAULT_OWN_PORTS);
        OneShot {
            local_addresses: args.node_addresses.iter().copied().collect(),
            families: config.families(),
            config,
            node,
            objects,
        }
    }

    pub fn plan(&self) -> Plan {
        plan::plan(&Input {
            services: self.objects.services.iter().collect(),
            slices: self.objects.slices.iter().collect(),
            node: &self.node,
            local_addresses: &self.local_addresses,
            families: self.families,
            config: &self.config,
            // `render` and `apply` plan from the files and flags: following the host's listeners
            // is the running agent's job.
            listeners: &Default::default(),
        })
    }
}

/// This node: a Node of that name from the files if there is one, with `--node-labels` added
/// to its labels and every `--node-address` added as an InternalIP.
pub fn node_info(objects: &ObjectFiles, args: &FileArgs) -> NodeInfo {
    let mut node = objects
        .nodes
        .iter()
        .find(|n| n.metadata.name.as_deref() == Some(args.node_name.as_str()))
        .map(NodeInfo::from_node)
        .unwrap_or_else(|| NodeInfo {
            name: args.node_name.clone(),
            ..NodeInfo::default()
        });
    if let Some(labels) = &args.node_labels {
        node.labels.extend(labels.clone());
    }
    for ip in &args.node_addresses {
        if !node.addresses.iter().any(|(_, a)| a == ip) {
            node.addresses.push((AddressKind::InternalIP, *ip));
        }
    }
    node
}

/// The nft script for a plan: each table replaced atomically (`nft -f` accepts it whether or
/// not the tables exist).
pub fn render(plan: &Plan) -> String {
    plan.tables
        .iter()
        .map(nodelb_netfilter::render_replace)
        .collect::<Vec<_>>()
        .join("\n")
}

/// What `apply` did.
#[derive(Clone, Debug, Default)]
pub struct Applied {
    pub tables: Vec<TableRef>,
    pub deleted: Vec<TableRef>,
    pub objects: usize,
    pub stats: CommitStats,
}

impl fmt::Display for Applied {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names = |v: &[TableRef]| {
            v.iter()
                .map(|t| t.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        };
        write!(
            f,
            "applied [{}]: {} objects, {} bytes, encode {:?}, commit {:?}",
            names(&self.tables),
            self.objects,
            self.stats.bytes,
            self.stats.encode,
            self.stats.commit
        )?;
        if !self.deleted.is_empty() {
            write!(f, "; deleted [{}]", names(&self.deleted))?;
        }
        Ok(())
    }
}

/// Program the plan's tables in one batch, then delete nodelb's table of any family that is
/// off (when it exists). Counters start from the plan's values, as a fresh install's do.
pub fn apply(
    plan: Plan,
    families: Families,
    config: &Config,
) -> Result<Applied, nodelb_netfilter::Error> {
    let mut committer = Committer::new(Nft::open()?);
    let tables: Vec<TableRef> = plan.tables.iter().map(TableRef::of).collect();
    let objects = plan.tables.iter().map(|t| t.object_count()).sum();
    // Encoded once, consumed while encoded; nothing is kept: this committer commits once.
    let mut once = Some(plan.tables);
    let mut build = || once.take().unwrap_or_default();
    let off = [IpFamily::V4, IpFamily::V6]
        .into_iter()
        .filter(|f| !families.contains(*f))
        .map(|f| config.table_ref(f));
    let done = committer.commit(Commit::replace(&mut build).reset_counters().absent(off))?;
    Ok(Applied {
        tables,
        deleted: done.deleted,
        objects,
        stats: done.stats,
    })
}

/// Waits until nothing accepts connections on `addr` (refused, or no answer within a second),
/// for at most `wait`.
pub fn wait_until_closed(addr: std::net::SocketAddr, wait: Duration) -> anyhow::Result<()> {
    let deadline = Instant::now() + wait;
    let mut said = false;
    while std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(1)).is_ok() {
        if Instant::now() >= deadline {
            anyhow::bail!(
                "the agent on {addr} still runs after {wait:?}: stop it first (manifests/cleanup/ schedules the agent DaemonSet on no node)"
            );
        }
        if !said {
            println!("waiting for the agent on {addr} to stop");
            said = true;
        }
        std::thread::sleep(Duration::from_secs(1));
    }
    Ok(())
}

/// `cleanup`: delete `ip nodelb` and `ip6 nodelb` where they exist; nothing else.
pub fn cleanup(table_name: &str) -> Result<Vec<TableRef>, nodelb_netfilter::Error> {
    let config = Config {
        table_name: table_name.to_string(),
        ..Config::default()
    };
    let both = [IpFamily::V4, IpFamily::V6].map(|f| config.table_ref(f));
    let mut committer = Committer::new(Nft::open()?);
    Ok(committer
        .commit(Commit::edit(Vec::new()).absent(both))?
        .deleted)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cli::{Cli, Command};
    use clap::Parser;

    fn args(extra: &[&str]) -> FileArgs {
        let mut v = vec![
            "nodelb-agent",
            "render",
            "-f",
            "x.yaml",
            "--node-name",
            "n1",
        ];
        v.extend_from_slice(extra);
        match Cli::parse_from(v).command {
            Command::Render(a) => a,
            _ => unreachable!(),
        }
    }

    #[test]
    fn node_from_flags_and_files() {
        let mut o = ObjectFiles::default();
        o.add_text(
            std::path::Path::new("n.yaml"),
            "apiVersion: v1\nkind: Node\nmetadata: {name: n1, labels: {zone: a}}\nstatus:\n  addresses:\n  - {type: ExternalIP, address: 203.0.113.5}\n  - {type: Hostname, address: n1}\n",
        )
        .unwrap();
        let a = args(&[
            "--node-address",
            "192.0.2.1",
            "--node-address",
            "203.0.113.5",
            "--node-labels",
            "role=edge",
        ]);
        let one = OneShot::new(o, &a);
        assert_eq!(one.node.name, "n1");
        assert_eq!(one.node.labels.len(), 2);
        assert_eq!(
            one.node.addresses,
            vec![
                (AddressKind::ExternalIP, "203.0.113.5".parse().unwrap()),
                (AddressKind::InternalIP, "192.0.2.1".parse().unwrap()),
            ]
        );
        assert_eq!(one.local_addresses.len(), 2);
        assert_eq!(
            one.families,
            Families {
                v4: true,
                v6: false
            }
        );
        assert!(one
            .config
            .reserved_ports
            .contains(nodelb_core::vocab::Protocol::Tcp, 9254));
    }

    #[test]
    fn node_without_a_node_object() {
        let one = OneShot::new(
            ObjectFiles::default(),
            &args(&["--node-address", "2001:db8::1", "--ipv6", "--ipv4=false"]),
        );
        assert_eq!(
            one.node.addresses,
            vec![(AddressKind::InternalIP, "2001:db8::1".parse().unwrap())]
        );
        assert_eq!(
            one.families,
            Families {
                v4: false,
                v6: true
            }
        );
    }
}
