//! The `kprov` command: installs the TLS provider and the log filter, then hands the parsed
//! command line to [`kprov::cli::run`] and exits with its code.

fn main() {
    // The AWS SDK and kube both link rustls; exactly one process-wide provider must be
    // installed before the first TLS connection or rustls panics.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    let cli = kprov::cli::parse();
    // kube-rs logs every failed request at ERROR itself ("failed with error client error
    // (Connect)"), a raw line before kprov's own error that names the API's URL and the
    // cause: left to -vv.
    let filter = match cli.verbose {
        0 => "warn,kube_client::client::builder=off",
        1 => "kprov=debug,info,kube_client::client::builder=off",
        _ => "trace",
    };
    // An unset KPROV_LOG means the -v level; one that does not parse is a usage error, not
    // silently the default (the operator asked for logs they would not get).
    let env_filter = match std::env::var("KPROV_LOG") {
        Ok(v) if !v.trim().is_empty() => match tracing_subscriber::EnvFilter::try_new(&v) {
            Ok(f) => f,
            Err(e) => {
                eprintln!(
                    "error: KPROV_LOG={v:?} is not a log filter ({e}); e.g. KPROV_LOG=kprov=debug"
                );
                std::process::exit(kprov::cli::exit::USAGE);
            }
        },
        _ => tracing_subscriber::EnvFilter::new(filter),
    };
    // Colour only on a terminal: warnings logged into a CI log or a file stay plain text.
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr())
        && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(env_filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
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
