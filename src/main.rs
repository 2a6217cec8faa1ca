fn main() {
    // The AWS SDK and kube both link rustls; exactly one process-wide provider must be
    // installed before the first TLS connection or rustls panics.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cli = kprov::cli::parse();
    let filter = match cli.verbose {
        0 => "warn",
        1 => "kprov=debug,info",
        _ => "trace",
    };
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KPROV_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter)),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            std::process::exit(kprov::cli::exit::ERROR);
        }
    };
    let code = runtime.block_on(kprov::cli::run(cli));
    std::process::exit(code);
}
