//! Kubernetes I/O: what the API sends and how it is read.

pub mod wire;
