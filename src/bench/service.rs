//! `hypermnf bench service`. (stub: being written)
#[derive(Debug, Clone, clap::Args)]
pub struct Args {}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("bench service is not written yet")
}
