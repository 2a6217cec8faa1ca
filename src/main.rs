fn main() {
    // The AWS SDK and kube both link rustls; exactly one process-wide provider must be
    // installed before the first TLS connection or rustls panics.
    let _ = rustls::crypto::aws_lc_rs::default_provider().install_default();
    println!("kprov {}", env!("CARGO_PKG_VERSION"));
}
