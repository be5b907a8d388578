pub mod agent_access;
pub mod bench;
pub mod commit;
pub mod control_plane;
pub mod e2e;
pub mod element_watch;
pub mod exported;
pub mod flood;
pub mod kwok;
pub mod lb_services;
pub mod models;
pub mod netns;
pub mod nft;
pub mod old_server_proxy;
pub mod planning;
pub mod real_cluster;
pub mod request_budget;
pub mod sctp;
pub mod traffic;

pub use agent_access::{
    is_expected, rbac_expectations, AgentRequest, Scope, KUBELET_LEASE_NAMESPACE,
};
