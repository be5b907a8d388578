//! The host around the agent: forwarding sysctls, local addresses, listening sockets, other
//! tables' forward policies, privileges, the conntrack entries of nodelb's own Service ports.
//! Thin I/O; decisions are made by the callers from what these return.

pub mod addresses;
pub mod conntrack;
pub mod forward_policy;
pub mod listeners;
pub mod privileges;
pub mod sysctl;
#[cfg(test)]
mod test_netns;
