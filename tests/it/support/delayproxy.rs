//! A TCP proxy that delays every byte by a fixed one-way time in each direction: network
//! latency for benchmarks on a kernel without netem. One proxy per host; the host is reached
//! through the proxy's loopback port. Each direction is delayed by RTT/2, so a request and its
//! answer cost one RTT on top of whatever they cost without the proxy.
//!
//! What it models: propagation delay of the data, in order, per direction. What it does not:
//! TCP's own behaviour on a long link (the proxy acknowledges at once and buffers without
//! bound, so slow start and receive windows never stall a sender; on a real link a 1 MiB
//! upload on a fresh connection costs a few more round trips). The round trips it shows are
//! the protocol's own: SSH messages that wait for an answer.
//!
//! The proxy runs on its own thread and runtime, so a benchmark that blocks its own runtime
//! (waiting for `ansible-playbook`) does not stall the traffic.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

pub struct DelayProxy {
    /// The loopback port that reaches the target.
    pub port: u16,
    one_way_us: Arc<AtomicU64>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl DelayProxy {
    /// Listens on 127.0.0.1 (a free port) and forwards each connection to `target`, each
    /// direction delayed by `rtt / 2`.
    pub fn start(target: SocketAddr, rtt: Duration) -> DelayProxy {
        let one_way_us = Arc::new(AtomicU64::new((rtt / 2).as_micros() as u64));
        let listener = std::net::TcpListener::bind(("127.0.0.1", 0)).expect("proxy bind");
        listener.set_nonblocking(true).expect("proxy nonblocking");
        let port = listener.local_addr().expect("proxy address").port();
        let (stop, stopped) = tokio::sync::oneshot::channel();
        let delay = one_way_us.clone();
        std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .expect("proxy runtime");
            rt.block_on(async move {
                let listener = TcpListener::from_std(listener).expect("proxy listener");
                tokio::select! {
                    _ = stopped => {}
                    _ = accept_loop(listener, target, delay) => {}
                }
            });
        });
        DelayProxy {
            port,
            one_way_us,
            stop: Some(stop),
        }
    }

    /// Changes the round-trip time for data sent from now on.
    pub fn set_rtt(&self, rtt: Duration) {
        self.one_way_us
            .store((rtt / 2).as_micros() as u64, Ordering::SeqCst);
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
    }
}

async fn accept_loop(listener: TcpListener, target: SocketAddr, delay: Arc<AtomicU64>) {
    loop {
        let Ok((client, _)) = listener.accept().await else {
            continue;
        };
        let delay = delay.clone();
        tokio::spawn(async move {
            let Ok(server) = TcpStream::connect(target).await else {
                return;
            };
            // The proxy must not add its own waits (Nagle) to the delay it simulates.
            let _ = client.set_nodelay(true);
            let _ = server.set_nodelay(true);
            let (cr, cw) = client.into_split();
            let (sr, sw) = server.into_split();
            tokio::join!(pump(cr, sw, delay.clone()), pump(sr, cw, delay),);
        });
    }
}

/// Copies `from` to `to`, each chunk written `delay` after it was read; EOF is passed on
/// (after the same delay) as a half-close.
async fn pump(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Arc<AtomicU64>,
) {
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, Option<Vec<u8>>)>();
    let reader = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = from.read(&mut buf).await.unwrap_or(0);
            let due = Instant::now() + Duration::from_micros(delay.load(Ordering::SeqCst));
            if n == 0 {
                let _ = tx.send((due, None));
                return;
            }
            if tx.send((due, Some(buf[..n].to_vec()))).is_err() {
                return;
            }
        }
    };
    let writer = async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            match chunk {
                Some(c) => {
                    if to.write_all(&c).await.is_err() {
                        return;
                    }
                }
                None => {
                    let _ = to.shutdown().await;
                    return;
                }
            }
        }
    };
    tokio::join!(reader, writer);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn each_direction_is_delayed_and_the_bytes_arrive_intact() {
        // An echo server: one request, its answer.
        let echo = std::net::TcpListener::bind(("127.0.0.1", 0)).unwrap();
        let target = echo.local_addr().unwrap();
        std::thread::spawn(move || {
            let (mut c, _) = echo.accept().unwrap();
            let mut buf = [0u8; 5];
            c.read_exact(&mut buf).unwrap();
            c.write_all(&buf).unwrap();
        });
        let proxy = DelayProxy::start(target, Duration::from_millis(300));
        let mut c = std::net::TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
        let sent = std::time::Instant::now();
        c.write_all(b"hello").unwrap();
        let mut got = [0u8; 5];
        c.read_exact(&mut got).unwrap();
        assert_eq!(&got, b"hello");
        // One round trip: at least 150 ms out and 150 ms back.
        let took = sent.elapsed();
        assert!(took >= Duration::from_millis(300), "{took:?}");
    }
}
