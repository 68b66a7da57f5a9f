//! Service configuration. (stub: being written)
#[derive(Debug, Clone, clap::Args)]
pub struct ServeArgs {
    #[arg(long, env = "HYPERMNF_LISTEN", default_value = "127.0.0.1:8080")]
    pub listen: String,
}
