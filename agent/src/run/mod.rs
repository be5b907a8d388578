//! `run`: the agent.

pub mod logging;

use crate::cli::RunArgs;

pub async fn run(_args: RunArgs) -> anyhow::Result<()> {
    anyhow::bail!("not yet")
}
