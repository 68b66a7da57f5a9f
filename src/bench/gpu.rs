//! `hypermnf bench gpu`. (stub: being written)
#[derive(Debug, Clone, clap::Args)]
pub struct Args {}

pub fn run(args: &Args) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("bench gpu is not written yet")
}
