//! PostgreSQL and Redis for tests, over real connections.
//!
//! - [`TempDatabase`]: a fresh database on the machine's PostgreSQL
//!   (`SWITCHBOARD_TEST_POSTGRES`, default `postgres://postgres@127.0.0.1:5432/postgres`),
//!   dropped by [`TempDatabase::drop_now`].
//! - [`PrivatePostgres`]: a PostgreSQL server of the test's own (`initdb` and
//!   `pg_ctl` in a temporary directory, on a free port) that the test may stop
//!   and start; [`PrivateRedis`] likewise for `redis-server`.
//! - [`redis_url`]: the machine's Redis, with [`unique`] key prefixes.
//!
//! Tests never assume an empty server: every name is unique.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};

use sqlx::Connection;

/// A unique suffix for names (databases, key prefixes, files).
pub fn unique(prefix: &str) -> String {
    let mut bytes = [0u8; 6];
    getrandom::fill(&mut bytes).expect("random");
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!("{prefix}{}_{hex}", std::process::id())
}

/// The machine's PostgreSQL, as an administrator URL.
pub fn postgres_admin_url() -> String {
    std::env::var("SWITCHBOARD_TEST_POSTGRES").unwrap_or_else(|_| "postgres://postgres@127.0.0.1:5432/postgres".into())
}

/// The machine's Redis.
pub fn redis_url() -> String {
    std::env::var("SWITCHBOARD_TEST_REDIS").unwrap_or_else(|_| "redis://127.0.0.1:6379".into())
}

fn with_database(admin_url: &str, name: &str) -> String {
    match admin_url.rsplit_once('/') {
        Some((base, _)) => format!("{base}/{name}"),
        None => format!("{admin_url}/{name}"),
    }
}

/// A database created for one test.
pub struct TempDatabase {
    pub name: String,
    /// Its `postgres://` URL.
    pub url: String,
    admin_url: String,
}

impl TempDatabase {
    /// Creates an empty database on the machine's PostgreSQL.
    pub async fn create() -> TempDatabase {
        Self::create_on(&postgres_admin_url()).await
    }

    /// Creates an empty database on the server of `admin_url`.
    pub async fn create_on(admin_url: &str) -> TempDatabase {
        let name = unique("sb_test_");
        let mut conn = sqlx::PgConnection::connect(admin_url)
            .await
            .unwrap_or_else(|e| panic!("PostgreSQL at {admin_url}: {e} (is it running? see TESTING in README)"));
        sqlx::query(&format!("CREATE DATABASE {name}")).execute(&mut conn).await.expect("CREATE DATABASE");
        TempDatabase { url: with_database(admin_url, &name), name, admin_url: admin_url.to_owned() }
    }

    /// Drops the database (ending its connections).
    pub async fn drop_now(self) {
        if let Ok(mut conn) = sqlx::PgConnection::connect(&self.admin_url).await {
            let _ =
                sqlx::query(&format!("DROP DATABASE IF EXISTS {} WITH (FORCE)", self.name)).execute(&mut conn).await;
        }
    }
}

/// A port that was free a moment ago (the servers started on it make sure
/// they got it).
fn unused_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").expect("bind").local_addr().expect("addr").port()
}

fn pg_bin(tool: &str) -> PathBuf {
    if let Ok(dir) = std::env::var("SWITCHBOARD_TEST_PG_BIN") {
        return PathBuf::from(dir).join(tool);
    }
    let mut versions: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path().join("bin")).collect())
        .unwrap_or_default();
    versions.sort();
    versions.pop().map(|d| d.join(tool)).unwrap_or_else(|| PathBuf::from(tool))
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| o.stdout.starts_with(b"0\n"))
}

/// Runs a PostgreSQL tool, as the `postgres` user when we are root (the
/// server refuses to run as root).
fn pg_command(tool: &str) -> Command {
    if is_root() {
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--"]).arg(pg_bin(tool));
        c
    } else {
        Command::new(pg_bin(tool))
    }
}

/// `pg_ctl start` of the cluster in `dir` on `port`.
fn pg_start(dir: &Path, port: u16) -> Result<(), String> {
    let out = pg_command("pg_ctl")
        .arg("-D")
        .arg(dir.join("data"))
        .arg("-o")
        .arg(format!("-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off", port, dir.display()))
        .arg("-l")
        .arg(dir.join("log"))
        .args(["-w", "-t", "30", "start"])
        .stdout(Stdio::null())
        .output()
        .expect("pg_ctl start");
    if out.status.success() {
        Ok(())
    } else {
        let log = std::fs::read_to_string(dir.join("log")).unwrap_or_default();
        Err(format!("pg_ctl start on port {}: {}\n{log}", port, String::from_utf8_lossy(&out.stderr)))
    }
}

/// A PostgreSQL server of the test's own.
pub struct PrivatePostgres {
    dir: PathBuf,
    pub port: u16,
    /// Administrator URL (database `postgres`).
    pub url: String,
}

impl PrivatePostgres {
    /// `initdb` and start, on a free port.
    pub fn start() -> PrivatePostgres {
        let dir = std::env::temp_dir().join(unique("sb-pg-"));
        std::fs::create_dir_all(&dir).expect("temp dir");
        if is_root() {
            let status = Command::new("chown").arg("postgres").arg(&dir).status().expect("chown");
            assert!(status.success(), "chown postgres {}", dir.display());
        }
        let out = pg_command("initdb")
            .arg("-D")
            .arg(dir.join("data"))
            .args(["-A", "trust", "-U", "postgres", "--no-sync"])
            .stdout(Stdio::null())
            .output()
            .expect("initdb (apt-get install postgresql)");
        assert!(out.status.success(), "initdb: {}", String::from_utf8_lossy(&out.stderr));
        // A port is picked, then bound by the server: another test may take
        // it in between, and then the server fails to start (it never runs
        // on a port someone else listens on). Try again on another port.
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = unused_port();
            match pg_start(&dir, port) {
                Ok(()) => {
                    return PrivatePostgres { url: format!("postgres://postgres@127.0.0.1:{port}/postgres"), dir, port }
                }
                Err(e) => failures.push(e),
            }
        }
        panic!("pg_ctl start failed five times: {failures:#?}");
    }

    /// Starts the (stopped) server again, on the same port.
    pub fn resume(&self) {
        pg_start(&self.dir, self.port).unwrap_or_else(|e| panic!("{e}"));
    }

    /// Freezes the server and its connections (SIGSTOP): connections stay
    /// open and queries hang, as on a database that stopped answering.
    pub fn freeze(&self) {
        self.signal("STOP");
    }

    /// Lets a frozen server go on (SIGCONT).
    pub fn thaw(&self) {
        self.signal("CONT");
    }

    fn signal(&self, signal: &str) {
        let pid_file = self.dir.join("data/postmaster.pid");
        let text = std::fs::read_to_string(&pid_file).unwrap_or_else(|e| panic!("{}: {e}", pid_file.display()));
        let pid = text.lines().next().expect("the postmaster's pid").trim().to_owned();
        // The backends first (children of the postmaster), then the postmaster.
        let _ = Command::new("pkill").args([&format!("-{signal}"), "-P", &pid]).status().expect("pkill (procps)");
        let status = Command::new("kill").args([&format!("-{signal}"), &pid]).status().expect("kill");
        assert!(status.success(), "kill -{signal} {pid}");
    }

    /// Stops the server at once (connections are cut).
    pub fn stop(&self) {
        let _ = pg_command("pg_ctl")
            .arg("-D")
            .arg(self.dir.join("data"))
            .args(["-m", "immediate", "-w", "stop"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

impl Drop for PrivatePostgres {
    fn drop(&mut self) {
        // A test that failed while the server was frozen: let it stop.
        if let Some(pid) = std::fs::read_to_string(self.dir.join("data/postmaster.pid"))
            .ok()
            .and_then(|t| t.lines().next().map(|l| l.trim().to_owned()))
        {
            let _ = Command::new("kill").args(["-CONT", &pid]).status();
            let _ = Command::new("pkill").args(["-CONT", "-P", &pid]).status();
        }
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A `redis-server` of the test's own.
pub struct PrivateRedis {
    pub port: u16,
    pub url: String,
    child: Option<Child>,
}

impl PrivateRedis {
    pub fn start() -> PrivateRedis {
        // As for PostgreSQL: a picked port may be taken before the server
        // binds it; the server then says so and ends, and another is tried.
        let mut failures = Vec::new();
        for _ in 0..5 {
            let port = unused_port();
            let mut redis = PrivateRedis { port, url: format!("redis://127.0.0.1:{port}"), child: None };
            match redis.try_resume() {
                Ok(()) => return redis,
                Err(e) => failures.push(e),
            }
        }
        panic!("redis-server failed to start five times: {failures:#?}");
    }

    /// Starts the (stopped) server again, on the same port, empty.
    pub fn resume(&mut self) {
        self.try_resume().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Starts the server and waits until it says it accepts connections (on
    /// its own port: a mere TCP connect could reach another test's server).
    fn try_resume(&mut self) -> Result<(), String> {
        use std::io::BufRead;
        let mut child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server (apt-get install redis-server)");
        let mut lines = std::io::BufReader::new(child.stdout.take().expect("stdout")).lines();
        let mut said = String::new();
        let ready = loop {
            match lines.next() {
                Some(Ok(line)) => {
                    let ready = line.contains("Ready to accept connections");
                    said.push_str(&line);
                    said.push('\n');
                    if ready {
                        break true;
                    }
                }
                _ => break false,
            }
        };
        if !ready {
            let _ = child.kill();
            let _ = child.wait();
            return Err(format!("redis-server on port {}:\n{said}", self.port));
        }
        // Keep reading its log so that it never blocks on a full pipe.
        std::thread::spawn(move || lines.for_each(drop));
        self.child = Some(child);
        Ok(())
    }

    /// Kills the server.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Drop for PrivateRedis {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A test CA (`ca.pem`) and a certificate for `localhost` and 127.0.0.1
/// signed by it (`<name>.pem`, key `<name>.key`), made in `dir` with the
/// openssl CLI. Calling it again with another `name` makes another
/// certificate from the same CA.
pub fn make_certificate(dir: &std::path::Path, name: &str) {
    make_certificate_for(dir, name, "DNS:localhost,IP:127.0.0.1");
}

/// [`make_certificate`] for other names (`san`: a subjectAltName value
/// such as `"DNS:elsewhere.test"`).
pub fn make_certificate_for(dir: &std::path::Path, name: &str, san: &str) {
    signed(dir, "ca", "switchboard test CA", name, "/CN=localhost", &format!("subjectAltName={san}"));
}

/// A client certificate with this `subject` (openssl's `/O=…/CN=…` form)
/// for TLS client authentication (`<name>.pem`, key `<name>.key`), signed
/// by the CA `<ca>.pem` in `dir` (made first if it is not there yet).
pub fn make_client_certificate(dir: &std::path::Path, ca: &str, name: &str, subject: &str) {
    signed(dir, ca, &format!("{ca} test client CA"), name, subject, "extendedKeyUsage=clientAuth");
}

/// `<name>.pem` and `.key` (EC P-256, 2 days) with `subject` and the
/// extension `extension`, signed by the CA `<ca>.pem` and `.key` in `dir`
/// (made first, named `ca_name`, if it is not there yet).
fn signed(dir: &std::path::Path, ca: &str, ca_name: &str, name: &str, subject: &str, extension: &str) {
    let run = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let (ca_key, ca_pem, serial) = (format!("{ca}.key"), format!("{ca}.pem"), format!("{ca}.srl"));
    if !dir.join(&ca_pem).exists() {
        let subj = format!("/CN={ca_name}");
        run(&[&["req", "-x509"][..], &ec, &["-keyout", &ca_key, "-out", &ca_pem, "-days", "2", "-subj", &subj]]
            .concat());
    }
    let (key, csr, pem, ext) =
        (format!("{name}.key"), format!("{name}.csr"), format!("{name}.pem"), format!("{name}.cnf"));
    run(&[&["req", "-utf8"][..], &ec, &["-keyout", &key, "-out", &csr, "-subj", subject]].concat());
    std::fs::write(dir.join(&ext), format!("{extension}\nbasicConstraints=CA:FALSE\n")).unwrap();
    let sign = ["x509", "-req", "-in", &csr, "-CA", &ca_pem, "-CAkey", &ca_key, "-CAserial", &serial];
    run(&[&sign[..], &["-CAcreateserial", "-out", &pem, "-days", "2", "-extfile", &ext]].concat());
}
