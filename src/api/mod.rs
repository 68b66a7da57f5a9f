//! The HTTP service (`hypermnf serve`): axum routes over the job store, the storage and the workers.
//! The contract is `openapi.yaml`; `error` maps every failure to `{"code", "message"}`.

mod api_keys;
mod api_metrics;
pub mod auth;
pub mod batches;
mod context;
mod envi_upload;
mod envi_zip;
pub mod error;
pub mod formats;
pub mod health;
pub mod href;
mod intake;
pub mod job_view;
pub mod jobs;
pub mod lingering_close;
pub mod metrics;
pub mod multipart;
pub mod multipart_body;
pub mod npy_upload;
mod ortho;
pub mod ogc;
pub mod params;
pub mod preview;
pub mod systems;
pub mod tus;
pub mod upload;
pub mod web;

use std::net::SocketAddr;
use std::sync::Arc;

use anyhow::Context;
use axum::extract::DefaultBodyLimit;
use axum::http::StatusCode;
use axum::routing::get;
use axum::Router;
use tower_http::compression::predicate::{DefaultPredicate, NotForContentType, Predicate};
use tower_http::compression::CompressionLayer;
use tower_http::request_id::{MakeRequestUuid, PropagateRequestIdLayer, SetRequestIdLayer};
use tower_http::timeout::TimeoutLayer;
use tower_http::trace::TraceLayer;

pub use context::ApiContext;

use crate::config::ServeArgs;
use crate::jobs::{Runner, Workers};

/// The routes, with the tower-http layers (request ids, tracing, timeouts, compression).
pub fn app(ctx: ApiContext) -> Router {
    let timeout = ctx.config.request_timeout;
    let v1 = Router::new()
        .route("/jobs", get(jobs::list).post(jobs::create))
        .route("/jobs/{id}", get(jobs::get).delete(jobs::delete))
        .route("/jobs/{id}/result", get(jobs::result))
        .route("/jobs/{id}/metadata", get(jobs::metadata))
        .route("/jobs/{id}/preview", get(preview::preview))
        .route("/batches", get(batches::list).post(batches::create))
        .route("/batches/{id}", get(batches::get).delete(batches::delete))
        .route("/batches/{id}/system", get(batches::system))
        .route("/info", get(health::info))
        .merge(tus::routes())
        .merge(systems::routes());
    // Results are float samples that hardly compress; JSON does.
    let compress = DefaultPredicate::new()
        .and(NotForContentType::const_new("application/x-npy"))
        .and(NotForContentType::const_new("application/zip"))
        .and(NotForContentType::const_new("image/png"));
    Router::new()
        .nest("/v1", v1)
        .merge(ogc::routes())
        .route("/healthz", get(health::healthz))
        .route("/readyz", get(health::readyz))
        .route("/metrics", get(health::metrics))
        // Inside the routing, where the matched route's template is known.
        .route_layer(axum::middleware::from_fn_with_state(ctx.clone(), metrics::observe_request))
        .fallback(|| async { error::Error::new(StatusCode::NOT_FOUND, "not_found", "no such route") })
        // Uploads enforce --max-upload-bytes themselves while streaming (with JSON errors); the
        // extractors' own 2 MB default would cut multipart uploads short.
        .layer(DefaultBodyLimit::disable())
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, timeout))
        // Outside the timeout (so its 408 becomes JSON too), inside the compression.
        .layer(axum::middleware::map_response(error::jsonify_errors))
        .layer(CompressionLayer::new().compress_when(compress))
        .layer(TraceLayer::new_for_http())
        .layer(PropagateRequestIdLayer::x_request_id())
        .layer(SetRequestIdLayer::x_request_id(MakeRequestUuid))
        .with_state(ctx)
}

/// A running server: its address, and a handle to stop it.
pub struct Server {
    pub addr: SocketAddr,
    pub ctx: ApiContext,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
    workers: Workers,
    expiry: tokio::task::JoinHandle<()>,
}

impl Server {
    /// Stops accepting, finishes the requests in flight, and stops the workers (a job in progress is
    /// left 'running' and picked up again at the next start).
    pub async fn stop(mut self) -> anyhow::Result<()> {
        if let Some(tx) = self.shutdown.take() {
            let _ = tx.send(());
        }
        self.workers.abort();
        self.expiry.abort();
        (&mut self.task).await??;
        Ok(())
    }

    /// Waits until the server stops by itself (it does not, short of an I/O error).
    pub async fn wait(self) -> anyhow::Result<()> {
        self.task.await??;
        Ok(())
    }
}

/// Builds the shared state from the options: the API keys and input roots, and the jobs' runner
/// ([`Runner::open`]: the database, the storage, the backends and the job cache).
pub async fn context(args: ServeArgs) -> anyhow::Result<ApiContext> {
    std::fs::create_dir_all(&args.data_dir).with_context(|| format!("cannot create the data dir {}", args.data_dir.display()))?;
    let args = args.resolve_upload_limit();
    let keys = match &args.api_keys_file {
        Some(p) => Some(Arc::new(auth::ApiKeys::load(p)?)),
        None => None,
    };
    let mut roots = Vec::new();
    for r in &args.input_roots {
        roots.push(r.canonicalize().with_context(|| format!("input root {} does not exist", r.display()))?);
    }
    let references = crate::reference::References::new(&args.input_buckets, &args.input_hosts, &args.input_ca_certs)?;
    let runner = Runner::open(&args).await?.with_early_start(args.early_start).with_references(references);
    Ok(ApiContext {
        config: Arc::new(args),
        runner: Arc::new(runner),
        keys,
        metrics: Arc::new(metrics::ApiMetrics::default()),
        input_roots: Arc::new(roots),
    })
}

/// Starts the server: binds, starts the workers and the expiry of old jobs, and serves in the
/// background.
pub async fn start(args: ServeArgs) -> anyhow::Result<Server> {
    let addr: SocketAddr = tokio::net::lookup_host(&args.listen)
        .await
        .with_context(|| format!("cannot resolve --listen {}", args.listen))?
        .next()
        .with_context(|| format!("--listen {} resolves to no address", args.listen))?;
    if !addr.ip().is_loopback() && args.api_keys_file.is_none() && !args.insecure {
        anyhow::bail!(
            "refusing to listen on {addr} (not a loopback address) without --api-keys-file; \
             pass --insecure to do it anyway"
        );
    }
    let workers = args.workers as usize;
    let ctx = context(args).await?;
    let listener = tokio::net::TcpListener::bind(addr).await.with_context(|| format!("cannot listen on {addr}"))?;
    let addr = listener.local_addr()?;
    let running = ctx.runner.start(workers);
    let (runner, retention, uploads_ctx) = (ctx.runner.clone(), ctx.config.retention, ctx.clone());
    let expiry = tokio::spawn(async move {
        tokio::join!(crate::jobs::expire_loop(&runner, retention), tus::expire_loop(uploads_ctx));
    });
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let router = app(ctx.clone());
    let task = tokio::spawn(async move {
        // Closing lingeringly, so that a client still sending a refused upload gets its answer.
        axum::serve(lingering_close::Listener(listener), router)
            .with_graceful_shutdown(async move {
                let _ = rx.await;
            })
            .await
    });
    Ok(Server { addr, ctx, shutdown: Some(tx), task, workers: running, expiry })
}

/// `hypermnf serve`: runs until SIGINT or SIGTERM.
pub async fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let server = start(args).await?;
    let b = server.ctx.runner.backends.default_backend();
    tracing::info!(addr = %server.addr, backend = b.name(), device = %b.device(), "hypermnf serve is listening");
    // On stdout too, for scripts and tests that started it on port 0.
    println!("listening on http://{}", server.addr);
    use std::io::Write;
    let _ = std::io::stdout().flush();
    shutdown_signal().await;
    tracing::info!("shutting down");
    server.stop().await
}

async fn shutdown_signal() {
    let ctrl_c = async {
        let _ = tokio::signal::ctrl_c().await;
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(_) => std::future::pending::<()>().await,
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        _ = ctrl_c => {},
        _ = term => {},
    }
}

/// Deletes the finished jobs older than `--retention`, with their files (`jobs::upkeep`, which the
/// server runs once a minute): how many.
pub async fn expire_once(ctx: &ApiContext) -> Result<usize, crate::jobs::StoreError> {
    crate::jobs::expire_once(&ctx.runner, ctx.config.retention).await
}
