//! What the machine carried while the simulation ran, sampled every few seconds: the leader
//! agent's memory, the load average, and the memory of kube-apiserver, etcd and kwok.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::bench::{memory, mib};

/// The largest values sampled so far (KiB, and the 1-minute load average).
#[derive(Debug, Clone, Default)]
pub struct Peaks {
    /// The leader agent's VmRSS, largest sampled.
    pub leader_rss: u64,
    /// The leader agent's VmHWM at the last sample.
    pub leader_hwm: u64,
    /// Its pid at the last sample (another pid: it restarted).
    pub leader_pids: Vec<u32>,
    pub load: f64,
    pub apiserver: u64,
    pub etcd: u64,
    pub kwok: u64,
    pub samples: usize,
}

impl Peaks {
    pub fn describe(&self) -> String {
        format!(
            "leader agent VmRSS max {:.1} MiB, VmHWM {:.1} MiB (pids {:?}); load average (1 min) \
             max {:.2}; VmRSS max: kube-apiserver {:.0} MiB, etcd {:.0} MiB, kwok {:.0} MiB \
             ({} samples)",
            mib(self.leader_rss),
            mib(self.leader_hwm),
            self.leader_pids,
            self.load,
            mib(self.apiserver),
            mib(self.etcd),
            mib(self.kwok),
            self.samples
        )
    }
}

/// Samples every `every` on `rt` until dropped; the agent on `leader_node` is the leader.
pub struct Sampler {
    peaks: Arc<Mutex<Peaks>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn load1() -> f64 {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0.0)
}

impl Sampler {
    pub fn start(rt: &tokio::runtime::Handle, leader_node: &str, every: Duration) -> Sampler {
        let peaks = Arc::new(Mutex::new(Peaks::default()));
        let (p, node) = (peaks.clone(), leader_node.to_string());
        let task = rt.spawn(async move {
            loop {
                let pid = super::fleet::agent_pid(&node);
                let m = pid.and_then(|pid| memory(pid).ok());
                let procs =
                    ["kube-apiserver", "etcd", "kwok"].map(super::fleet::cluster_process_rss);
                {
                    let mut p = p.lock().expect("peaks");
                    if let (Some(pid), Some(m)) = (pid, m) {
                        p.leader_rss = p.leader_rss.max(m.rss);
                        p.leader_hwm = m.hwm;
                        if p.leader_pids.last() != Some(&pid) {
                            p.leader_pids.push(pid);
                        }
                    }
                    p.load = p.load.max(load1());
                    p.apiserver = p.apiserver.max(procs[0].unwrap_or(0));
                    p.etcd = p.etcd.max(procs[1].unwrap_or(0));
                    p.kwok = p.kwok.max(procs[2].unwrap_or(0));
                    p.samples += 1;
                }
                tokio::time::sleep(every).await;
            }
        });
        Sampler { peaks, task }
    }

    pub fn peaks(&self) -> Peaks {
        self.peaks.lock().expect("peaks").clone()
    }
}
