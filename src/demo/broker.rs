//! The demo's MQTT broker: an embedded rumqttd (MQTT 3.1.1) on a free 127.0.0.1 port, running in
//! its own threads until the process ends, or a broker named by the operator, checked reachable.

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream, ToSocketAddrs};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Why the demo has no broker to talk to.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    #[error("cannot find a free localhost port for the embedded MQTT broker: {0}")]
    Port(#[source] std::io::Error),
    #[error("cannot start the embedded MQTT broker: {0}")]
    Start(String),
    #[error("the embedded MQTT broker did not accept connections on 127.0.0.1:{port} within {secs} s")]
    NotListening { port: u16, secs: u64 },
    #[error("`{0}` is not HOST:PORT")]
    BadAddress(String),
    #[error("cannot reach the MQTT broker at {addr}: {reason}")]
    Unreachable { addr: String, reason: String },
}

/// A broker's address as the agent's `[mqtt]` section and the subscriber need it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BrokerAddr {
    pub host: String,
    pub port: u16,
    /// True when this process runs it.
    pub embedded: bool,
}

impl std::fmt::Display for BrokerAddr {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}{}", self.host, self.port, if self.embedded { " (embedded rumqttd)" } else { "" })
    }
}

/// Parses `HOST:PORT` (`[v6]:PORT` too) and checks that something accepts TCP connections there.
pub fn external(addr: &str, timeout: Duration) -> Result<BrokerAddr, BrokerError> {
    let bad = || BrokerError::BadAddress(addr.to_string());
    let (host, port) = addr.rsplit_once(':').ok_or_else(bad)?;
    let port: u16 = port.parse().ok().filter(|&p| p > 0).ok_or_else(bad)?;
    let host = host.trim_start_matches('[').trim_end_matches(']');
    if host.is_empty() {
        return Err(bad());
    }
    let addrs: Vec<SocketAddr> =
        (host, port).to_socket_addrs().map_err(|e| BrokerError::Unreachable { addr: addr.to_string(), reason: e.to_string() })?.collect();
    let reached = addrs.iter().any(|a| TcpStream::connect_timeout(a, timeout).is_ok());
    if !reached {
        return Err(BrokerError::Unreachable {
            addr: addr.to_string(),
            reason: format!("no TCP connection within {} s", timeout.as_secs()),
        });
    }
    Ok(BrokerAddr { host: host.to_string(), port, embedded: false })
}

/// Starts rumqttd on a free 127.0.0.1 port and waits until it accepts connections.
pub fn start_embedded(timeout: Duration) -> Result<BrokerAddr, BrokerError> {
    let port = TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()).map_err(BrokerError::Port)?.port();
    let config = embedded_config(port);
    let (err_tx, err_rx) = mpsc::channel();
    std::thread::Builder::new()
        .name("mqtt-broker".into())
        .spawn(move || {
            // `start` runs the listener threads and only returns on a configuration error
            if let Err(e) = rumqttd::Broker::new(config).start() {
                let _ = err_tx.send(e.to_string());
            }
        })
        .map_err(|e| BrokerError::Start(e.to_string()))?;
    let t0 = Instant::now();
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    loop {
        if let Ok(e) = err_rx.try_recv() {
            return Err(BrokerError::Start(e));
        }
        if TcpStream::connect_timeout(&addr, Duration::from_millis(200)).is_ok() {
            return Ok(BrokerAddr { host: "127.0.0.1".into(), port, embedded: true });
        }
        if t0.elapsed() > timeout {
            return Err(BrokerError::NotListening { port, secs: timeout.as_secs() });
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// One MQTT 3.1.1 listener on 127.0.0.1:`port`, anonymous, payloads up to 16 MiB.
fn embedded_config(port: u16) -> rumqttd::Config {
    let connections = rumqttd::ConnectionSettings {
        connection_timeout_ms: 10_000,
        max_payload_size: 16 << 20,
        max_inflight_count: 500,
        auth: None,
        external_auth: None,
        dynamic_filters: true,
    };
    let server = rumqttd::ServerSettings {
        name: "demo-v4".into(),
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        tls: None,
        next_connection_delay_ms: 1,
        connections,
    };
    rumqttd::Config {
        id: 0,
        router: rumqttd::RouterConfig {
            max_connections: 64,
            max_outgoing_packet_count: 500,
            max_segment_size: 16 << 20,
            max_segment_count: 10,
            ..Default::default()
        },
        v4: Some(HashMap::from([("1".to_string(), server)])),
        ..Default::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn external_address_forms() {
        assert!(matches!(external("nohost", Duration::from_millis(100)), Err(BrokerError::BadAddress(_))));
        assert!(matches!(external("h:0", Duration::from_millis(100)), Err(BrokerError::BadAddress(_))));
        assert!(matches!(external(":1883", Duration::from_millis(100)), Err(BrokerError::BadAddress(_))));
        // a port nobody listens on: unreachable, reported with the address
        let port = TcpListener::bind(("127.0.0.1", 0)).unwrap().local_addr().unwrap().port();
        let e = external(&format!("127.0.0.1:{port}"), Duration::from_millis(200)).unwrap_err();
        assert!(matches!(&e, BrokerError::Unreachable { addr, .. } if addr.ends_with(&port.to_string())), "{e}");
    }

    #[test]
    fn embedded_broker_accepts_connections() {
        let b = start_embedded(Duration::from_secs(10)).unwrap();
        assert!(b.embedded && b.host == "127.0.0.1");
        assert!(external(&format!("127.0.0.1:{}", b.port), Duration::from_secs(2)).is_ok());
    }
}
