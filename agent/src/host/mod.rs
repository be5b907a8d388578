//! The host around the agent: forwarding sysctls, local addresses, other tables' forward
//! policies, privileges, the conntrack entries of nodelb's own Service ports. Thin I/O;
//! decisions are made by the callers from what these return.

pub mod addresses;
pub mod conntrack;
pub mod forward_policy;
pub mod privileges;
pub mod sysctl;
