//! `yolo-edge probe`: asks a running agent's `[metrics]` listener for `/readyz` (or `/healthz`)
//! and exits 0 when it answers 200, 1 otherwise: the container HEALTHCHECK and the systemd
//! unit's start-up wait, with no curl in the image.

use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

#[derive(Args)]
pub struct ProbeArgs {
    /// Agent configuration (TOML): the address is its `[metrics] listen`.
    #[arg(long, short)]
    config: PathBuf,
    /// What to ask: /readyz (the agent can work) or /healthz (the process answers).
    #[arg(default_value = "/readyz", value_parser = ["/readyz", "/healthz"])]
    path: String,
    /// Keep asking for up to this many seconds until the answer is 200.
    #[arg(long, default_value_t = 0)]
    wait: u64,
    /// Succeed when the config has no `[metrics]` table (nothing to ask).
    #[arg(long)]
    if_configured: bool,
}

pub fn run(a: ProbeArgs) -> anyhow::Result<ExitCode> {
    let cfg = yolo_edge::agent::config::Config::load(&a.config)?;
    let Some(m) = cfg.metrics else {
        if a.if_configured {
            println!("{}: no [metrics] table; nothing to probe", a.config.display());
            return Ok(ExitCode::SUCCESS);
        }
        anyhow::bail!("{}: no [metrics] table, so the agent serves no {}", a.config.display(), a.path);
    };
    let addr = local(m.listen);
    let until = Instant::now() + Duration::from_secs(a.wait);
    loop {
        let answer = get(addr, &a.path);
        match &answer {
            Ok((200, body)) => {
                print!("{body}");
                return Ok(ExitCode::SUCCESS);
            }
            _ if Instant::now() < until => std::thread::sleep(Duration::from_millis(500)),
            Ok((status, body)) => {
                eprint!("{addr}{}: HTTP {status}: {body}", a.path);
                return Ok(ExitCode::from(super::exit::OTHER));
            }
            Err(e) => return Err(anyhow::anyhow!("{e}")).with_context(|| format!("asking {addr}{}", a.path)),
        }
    }
}

/// A wildcard listen address is asked on loopback.
fn local(listen: SocketAddr) -> SocketAddr {
    match listen.ip() {
        IpAddr::V4(ip) if ip.is_unspecified() => SocketAddr::new(Ipv4Addr::LOCALHOST.into(), listen.port()),
        IpAddr::V6(ip) if ip.is_unspecified() => SocketAddr::new(Ipv6Addr::LOCALHOST.into(), listen.port()),
        _ => listen,
    }
}

fn get(addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let t = Duration::from_secs(5);
    let mut s = TcpStream::connect_timeout(&addr, t)?;
    s.set_read_timeout(Some(t))?;
    s.set_write_timeout(Some(t))?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")?;
    let mut out = Vec::new();
    s.take(64 << 10).read_to_end(&mut out)?;
    let out = String::from_utf8_lossy(&out);
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head.split(' ').nth(1).and_then(|s| s.parse().ok()).ok_or_else(|| std::io::Error::other("not an HTTP answer"))?;
    Ok((status, body.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wildcard_addresses_are_asked_on_loopback() {
        assert_eq!(local("0.0.0.0:9464".parse().unwrap()), "127.0.0.1:9464".parse().unwrap());
        assert_eq!(local("[::]:9464".parse().unwrap()), "[::1]:9464".parse().unwrap());
        assert_eq!(local("10.0.0.5:9464".parse().unwrap()), "10.0.0.5:9464".parse().unwrap());
    }
}
