//! The HTTP service. (stub: being written)
pub async fn serve(args: crate::config::ServeArgs) -> anyhow::Result<()> {
    let _ = args;
    anyhow::bail!("the service is not written yet")
}
