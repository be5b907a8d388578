//! The backend the real-cluster tests run as pods (scripts/images.sh builds it into the backend
//! image beside busybox): it speaks the harness servers' protocol (`crate::traffic`), so the
//! tests' clients read pod names the same way they read test servers' names.
//!
//! - TCP `:8080`: every connection gets "<name> <peer-ip>\n" and is closed.
//! - TCP `:8081`: an echo session: every line gets "<name> <peer-ip>\n" until the peer closes
//!   (long-lived connections, to see that they survive an update).
//! - UDP `:9000`: every datagram gets "<name> <peer-ip>".
//!
//! `<name>` is `$POD_NAME`, else the host name. SIGTERM ends the process at once (as PID 1 it
//! would otherwise be ignored): a pod's `preStop` hook is what keeps it serving while it
//! drains, as in a real deployment.
//!
//! Only the standard library: scripts/images.sh compiles this file alone with `rustc` into a
//! static binary, without cargo and without the crate's dependencies.

use std::io::{BufRead, BufReader, Write};
use std::net::{SocketAddr, TcpListener, TcpStream, UdpSocket};

extern "C" {
    fn signal(signum: i32, handler: extern "C" fn(i32)) -> usize;
    fn _exit(status: i32) -> !;
}

const SIGTERM: i32 = 15;

extern "C" fn on_sigterm(_: i32) {
    // SAFETY: _exit is async-signal-safe.
    unsafe { _exit(0) }
}

fn name() -> String {
    std::env::var("POD_NAME")
        .ok()
        .filter(|n| !n.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/etc/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "backend".to_string())
}

fn serve_tcp(listener: TcpListener, name: String) {
    for stream in listener.incoming().flatten() {
        if let Ok(peer) = stream.peer_addr() {
            let mut stream = stream;
            let _ = writeln!(stream, "{name} {}", peer.ip().to_canonical());
        }
    }
}

fn serve_echo(listener: TcpListener, name: String) {
    for stream in listener.incoming().flatten() {
        let name = name.clone();
        std::thread::spawn(move || echo_session(stream, &name));
    }
}

fn echo_session(stream: TcpStream, name: &str) {
    let Ok(peer) = stream.peer_addr() else { return };
    let Ok(mut out) = stream.try_clone() else {
        return;
    };
    for line in BufReader::new(stream).lines() {
        if line.is_err() || writeln!(out, "{name} {}", peer.ip().to_canonical()).is_err() {
            return;
        }
    }
}

fn serve_udp(socket: UdpSocket, name: String) {
    let mut buf = [0u8; 2048];
    loop {
        if let Ok((_, peer)) = socket.recv_from(&mut buf) {
            let reply = format!("{name} {}", peer.ip().to_canonical());
            let _ = socket.send_to(reply.as_bytes(), peer);
        }
    }
}

fn bind_tcp(port: u16) -> TcpListener {
    let addr = SocketAddr::from(([0, 0, 0, 0], port));
    TcpListener::bind(addr).unwrap_or_else(|e| panic!("binding TCP {addr}: {e}"))
}

fn main() {
    // SAFETY: installs an async-signal-safe handler.
    unsafe { signal(SIGTERM, on_sigterm) };
    let name = name();
    let udp_addr = SocketAddr::from(([0, 0, 0, 0], 9000));
    let udp = UdpSocket::bind(udp_addr).unwrap_or_else(|e| panic!("binding UDP {udp_addr}: {e}"));
    let (tcp, echo) = (bind_tcp(8080), bind_tcp(8081));
    println!("{name}: serving TCP :8080, TCP echo :8081, UDP :9000");
    let n = name.clone();
    std::thread::spawn(move || serve_udp(udp, n));
    let n = name.clone();
    std::thread::spawn(move || serve_echo(echo, n));
    serve_tcp(tcp, name);
}
