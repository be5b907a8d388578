//! End-to-end readiness: the agent's `/readyz` says whether it applies the cluster now, not
//! only whether its process runs. A node cut off the API server without a word (no RST, no
//! ICMP: a routing rule in the control plane's namespace discards what the server sends it,
//! `Cluster::partition`) keeps its rules and its process; the agent must find the dead
//! connections itself (TCP keep-alive and `TCP_USER_TIMEOUT`), turn unready once no watch of
//! its inputs has had a stream for `--max-view-age`, and be ready again, with what changed
//! meanwhile programmed before its first ready answer, soon after the path heals. A hung sync loop or kernel actor is
//! judged the same way (`nodelb_core::readiness`, unit tests there and in the agent's
//! `/readyz` test); the real-cluster test takes a black-holed agent out of every status
//! (`integration/tests/cluster.rs`).
//!
//! Run as root: `cargo test -p nodelb-integration --test e2e_readiness -- --nocapture`.

use std::time::{Duration, Instant};

use nodelb_integration::e2e::{wait_for, Cluster, ClusterOptions};
use nodelb_integration::netns::require_root;

mod common;
use common::{apply, service};

/// `--max-view-age` of this test's agent.
const VIEW: Duration = Duration::from_secs(3);

/// Heals node `i`'s link when the test ends, whether it passed or not.
struct Heal<'c>(&'c Cluster, usize);

impl Drop for Heal<'_> {
    fn drop(&mut self) {
        self.0.partition(self.1, false);
    }
}

#[test]
fn a_deaf_agent_turns_unready_and_is_ready_again_soon_after_the_path_heals() {
    if !require_root("a_deaf_agent_turns_unready_and_is_ready_again_soon_after_the_path_heals") {
        return;
    }
    let mut c = Cluster::start(ClusterOptions {
        nodes: 1,
        backends_per_node: 1,
        agent_args: vec!["--max-view-age".into(), format!("{}s", VIEW.as_secs())],
        ..ClusterOptions::default()
    });
    if c.is_external() {
        println!("SKIP: cutting a node off the API server needs the local control plane");
        return;
    }
    apply(&c, service("before", 8101));
    wait_for("Service before programmed", Duration::from_secs(20), || {
        programs(&c, "before")
    });
    c.wait_ready(0);

    let cut = Instant::now();
    c.partition(0, true);
    let heal = Heal(&c, 0);
    let body = wait_for("the agent unready", Duration::from_secs(90), || {
        match c.readyz(0) {
            Ok((503, body)) => Ok(body),
            other => Err(format!("{other:?}")),
        }
    });
    let unready = cut.elapsed();
    println!("measured: cut off the API server: unready after {unready:.1?} (--max-view-age {VIEW:?}, TCP user timeout 10 s); /readyz said:\n{body}");
    assert!(
        body.contains("does not hear the API server"),
        "unready because it does not hear the server: {body}"
    );
    let pid = c.agent_pid(0).expect("the agent was started");
    assert!(
        nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok(),
        "the process runs on: only readiness says it"
    );
    // A change made while the node is deaf does not reach it.
    apply(&c, service("during", 8102));
    std::thread::sleep(Duration::from_secs(2));
    assert!(
        programs(&c, "during").is_err(),
        "a deaf agent cannot know of a Service created meanwhile"
    );

    let healed = Instant::now();
    drop(heal);
    wait_for(
        "the agent ready again",
        Duration::from_secs(60),
        || match c.readyz(0) {
            Ok((200, _)) => Ok(()),
            other => Err(format!("{other:?}")),
        },
    );
    let back = healed.elapsed();
    // Ready only once caught up: the watches lost for longer than --max-view-age listed again
    // and that list is committed (`watching::relisting`), so the first 200 comes after it.
    assert_eq!(
        programs(&c, "during"),
        Ok(()),
        "at its first ready answer after the partition, the agent has programmed what changed meanwhile"
    );
    println!(
        "measured: path healed: ready again after {back:.1?}, with the Service created meanwhile programmed"
    );
}

/// Ok once node 0's table has a rule of Service `name`.
fn programs(c: &Cluster, name: &str) -> Result<(), String> {
    let table = c.nft_table(0, "ip").unwrap_or_default();
    let key = format!("{}/{name}", c.namespace());
    if table.contains(&key) {
        Ok(())
    } else {
        Err(format!("no {key} in node 0's table"))
    }
}
