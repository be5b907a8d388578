//! A fault-injecting proxy in front of the real kube-apiserver that imitates an older server:
//! what the real server cannot do on demand. Used only by tests that ask for it
//! ([`crate::e2e::ClusterOptions::old_server`]).

use std::net::SocketAddr;

use crate::netns::Netns;

/// How the proxy imitates an older server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OldServer {
    /// `GET /version` answers `1.<minor>` (gitVersion `v1.<minor>.0`).
    pub minor: u32,
    /// Writes of `services/status` lose `status.loadBalancer.ingress[].ipMode` on the way, as
    /// a server older than 1.30 drops the field it does not know.
    pub drop_ip_mode: bool,
}

/// A running proxy; stopped on drop.
#[derive(Debug)]
pub struct OldServerProxy {
    behaviour: OldServer,
    port: u16,
}

impl OldServerProxy {
    /// Listens on `0.0.0.0:<port>` (plain HTTP) inside `ns` and forwards every request to the
    /// HTTPS server at `upstream` (also inside `ns`), trusting `ca_pem`.
    pub fn start(
        _ns: &Netns,
        port: u16,
        _upstream: SocketAddr,
        _ca_pem: &str,
        behaviour: OldServer,
    ) -> Result<OldServerProxy, String> {
        Err(format!(
            "the old-server proxy ({behaviour:?} on port {port}) is not written yet"
        ))
    }
}
