//! The router and mock upstreams in this process, each on its own threads,
//! with the router on a single thread whose allocations are counted.

use std::net::SocketAddr;
use std::sync::mpsc;
use std::thread;

use switchboard_mock::{Mock, Options};

use crate::{count_this_thread, Conn};

/// A running router in front of mock upstreams.
pub struct Rig {
    /// The router's address.
    pub router: SocketAddr,
    /// The mock upstreams' addresses.
    pub mocks: Vec<SocketAddr>,
    /// A session id on the router.
    pub session: String,
}

/// Starts a stateless mock upstream on its own thread and runtime.
pub fn start_mock(options: Options) -> SocketAddr {
    let (tx, rx) = mpsc::channel();
    thread::spawn(move || {
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        runtime.block_on(async move {
            let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
            tx.send(listener.local_addr().expect("addr")).expect("send");
            Mock::new(options).serve_http(listener, std::future::pending()).await.expect("mock");
        });
    });
    rx.recv().expect("mock address")
}

impl Rig {
    /// A router with `upstreams` HTTP upstreams named `u0`, `u1`, …, all
    /// pointing at one stateless mock with `tools` extra tools; an initialized
    /// session is ready.
    pub fn start(upstreams: usize, tools: usize) -> Rig {
        Rig::start_with(upstreams, tools, "")
    }

    /// [`Rig::start`] with more configuration (whole sections, TOML). No
    /// database unless `extra` has a `[database]` section.
    pub fn start_with(upstreams: usize, tools: usize, extra: &str) -> Rig {
        let mock =
            start_mock(Options { name: "bench".into(), stateless: true, extra_tools: tools, ..Options::default() });
        let mut config = String::from(
            "[log]\nlevel = \"warn\"\n[catalog]\nretry_after = \"60s\"\n[auth]\nmode = \"none\"\n\
             [egress]\nallow = [\"loopback\"]\n",
        );
        if !extra.contains("[database]") {
            config.push_str("[database]\nurl = \"\"\n");
        }
        config.push_str(extra);
        for i in 0..upstreams {
            config.push_str(&format!(
                "[[upstreams]]\nname = \"u{i}\"\ntransport = \"http\"\nurl = \"http://{mock}/mcp\"\nlist_timeout = \"30s\"\n"
            ));
        }
        let config = switchboard_router::Config::from_toml(&config).expect("config");
        let (tx, rx) = mpsc::channel();
        thread::spawn(move || {
            count_this_thread();
            let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
            runtime.block_on(async move {
                let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
                tx.send(listener.local_addr().expect("addr")).expect("send");
                switchboard_router::serve(listener, config, std::future::pending()).await.expect("router");
            });
        });
        let router = rx.recv().expect("router address");
        let mut conn = Conn::open(router);
        let init = br#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"bench","version":"0"}}}"#;
        let answer = conn.send(&conn.request("/mcp", &[], init));
        assert_eq!(answer.status, 200, "initialize: {}", String::from_utf8_lossy(&answer.body));
        let session = answer.header("mcp-session-id").expect("session id").to_owned();
        Rig { router, mocks: vec![mock], session }
    }

    /// A connection to the router.
    pub fn connect(&self) -> Conn {
        Conn::open(self.router)
    }

    /// A prebuilt request on this rig's session.
    pub fn request(&self, conn: &Conn, body: &[u8]) -> Vec<u8> {
        conn.request("/mcp", &[("Mcp-Session-Id", &self.session), ("Mcp-Protocol-Version", "2025-11-25")], body)
    }
}
