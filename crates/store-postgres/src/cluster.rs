//! A throwaway PostgreSQL cluster for tests: `initdb` and `pg_ctl` from the
//! distribution's packages, run as an unprivileged user, on a free loopback port, in a
//! temporary directory, stopped and removed at the end.
//!
//! PostgreSQL refuses to run as root. When the tests run as root (CI does), the cluster
//! runs as the `postgres` system user that the distribution's package creates, through
//! `runuser`. A missing installation is a failure that says what to install, never a
//! skipped test.
//!
//! The cluster is stopped when its [`Cluster`] is dropped (also during a panic), and a
//! watcher process stops it when the test process ends without dropping it (a shared
//! cluster in a `static`, a test binary killed): the watcher waits for its standard
//! input, a pipe only the test process holds, to close.

use std::io::Write;
use std::net::{Ipv4Addr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// The user a cluster runs as when the tests run as root.
const SYSTEM_USER: &str = "postgres";

/// The superuser the cluster is created with (trust authentication, loopback only).
const SUPERUSER: &str = "gate";

/// What to do when PostgreSQL is missing.
const INSTALL_HINT: &str = "PostgreSQL's server programs (initdb, pg_ctl) were not found: \
     install them with `apt-get install -y postgresql` (Debian, Ubuntu) or your \
     distribution's postgresql server package, or put their directory on PATH";

/// A running throwaway cluster. Dropping it stops the server and removes its directory.
#[derive(Debug)]
pub struct Cluster {
    bin: PathBuf,
    dir: PathBuf,
    port: u16,
    run_as: Option<String>,
    watcher: Option<Child>,
    databases: AtomicU64,
}

static SHARED: OnceLock<Cluster> = OnceLock::new();

impl Cluster {
    /// One cluster per test process, started on first use and stopped when the process
    /// ends. Each test takes a database of its own with [`Cluster::fresh_database`].
    ///
    /// # Panics
    /// If the cluster cannot be started; the message says what to install or fix.
    pub fn shared() -> &'static Cluster {
        SHARED.get_or_init(|| Cluster::start().unwrap_or_else(|error| panic!("{error}")))
    }

    /// Start a new cluster in a temporary directory, with the server programs found on
    /// `PG_BIN`, `PATH` or Debian's `/usr/lib/postgresql/<version>/bin`.
    pub fn start() -> Result<Self, String> {
        Self::start_with(find_bin()?)
    }

    /// Start a new cluster with the server programs in `bin`.
    pub fn start_with(bin: PathBuf) -> Result<Self, String> {
        if !bin.join("initdb").is_file() || !bin.join("pg_ctl").is_file() {
            return Err(format!(
                "{} holds no initdb and pg_ctl; {INSTALL_HINT}",
                bin.display()
            ));
        }
        let run_as = run_as()?;
        static STARTED: AtomicU64 = AtomicU64::new(0);
        let dir = std::env::temp_dir().join(format!(
            "gate-pg-{}-{}",
            std::process::id(),
            STARTED.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)
            .map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let mut cluster = Cluster {
            bin,
            dir,
            port: 0,
            run_as,
            watcher: None,
            databases: AtomicU64::new(0),
        };
        if let Some(user) = &cluster.run_as {
            let status = Command::new("chown")
                .arg(user)
                .arg(&cluster.dir)
                .status()
                .map_err(|e| format!("cannot run chown: {e}"))?;
            if !status.success() {
                return Err(format!(
                    "cannot give {} to the user {user}",
                    cluster.dir.display()
                ));
            }
        }
        let data = cluster.dir.join("data");
        cluster.run(
            "initdb",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-U".as_ref(),
                SUPERUSER.as_ref(),
                "--auth=trust".as_ref(),
                "-E".as_ref(),
                "UTF8".as_ref(),
                "--no-sync".as_ref(),
            ],
        )?;
        cluster.watcher = Some(cluster.watch()?);
        let mut last = String::new();
        for _ in 0..5 {
            cluster.port = free_port()?;
            match cluster.start_server() {
                Ok(()) => return Ok(cluster),
                // Another process may have taken the port between the probe and the start.
                Err(error) => last = error,
            }
        }
        Err(last)
    }

    /// The URL of database `name` on this cluster.
    pub fn url(&self, name: &str) -> String {
        format!(
            "postgres://{SUPERUSER}@127.0.0.1:{}/{name}?connect_timeout=10",
            self.port
        )
    }

    /// The loopback port the server listens on.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Create a new, empty database and return its URL.
    ///
    /// # Panics
    /// If the server refuses (a test cannot go on without its database).
    pub fn fresh_database(&self) -> String {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let name = format!("test_{n}");
        let admin = self.url("postgres");
        // The client runs a runtime of its own: off this thread, which may be a task's.
        std::thread::scope(|scope| {
            scope
                .spawn(|| {
                    let mut client = postgres::Client::connect(&admin, postgres::NoTls)
                        .unwrap_or_else(|e| panic!("cannot reach the test cluster: {e}"));
                    client
                        .batch_execute(&format!("CREATE DATABASE {name}"))
                        .unwrap_or_else(|e| panic!("cannot create database {name}: {e}"));
                })
                .join()
                .unwrap_or_else(|_| panic!("cannot create database {name}"));
        });
        self.url(&name)
    }

    /// Stop the server now (fast shutdown: connections are closed).
    pub fn stop(&self) {
        let data = self.dir.join("data");
        let _ = self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-m".as_ref(),
                "fast".as_ref(),
                "-w".as_ref(),
                "stop".as_ref(),
            ],
        );
    }

    /// Start a stopped server again on the same port.
    pub fn restart(&self) -> Result<(), String> {
        self.start_server()
    }

    /// Start the server on [`Cluster::port`] and wait (up to 60 s) until it accepts
    /// connections.
    fn start_server(&self) -> Result<(), String> {
        let data = self.dir.join("data");
        let options = format!(
            "-p {} -k {} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
            self.port,
            self.dir.display()
        );
        let log = self.dir.join("server.log");
        self.run(
            "pg_ctl",
            &[
                "-D".as_ref(),
                data.as_os_str(),
                "-o".as_ref(),
                options.as_ref(),
                "-l".as_ref(),
                log.as_os_str(),
                "-w".as_ref(),
                "-t".as_ref(),
                "60".as_ref(),
                "start".as_ref(),
            ],
        )
    }

    fn command(&self, program: &str) -> Command {
        let path = self.bin.join(program);
        match &self.run_as {
            Some(user) => {
                let mut command = Command::new("runuser");
                command.arg("-u").arg(user).arg("--").arg(path);
                command
            }
            None => Command::new(path),
        }
    }

    fn run(&self, program: &str, args: &[&std::ffi::OsStr]) -> Result<(), String> {
        let output = self
            .command(program)
            .args(args)
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("cannot run {program}: {e}; {INSTALL_HINT}"))?;
        if output.status.success() {
            return Ok(());
        }
        let log = std::fs::read_to_string(self.dir.join("server.log")).unwrap_or_default();
        Err(format!(
            "{program} failed ({}): {}{}\n{log}",
            output.status,
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ))
    }

    /// A shell that waits for its standard input to close, then stops the server and
    /// removes the directory: the cleanup of a process that ended without `Drop`.
    ///
    /// It ignores the signals that end a process group (`timeout`'s SIGTERM, a
    /// terminal's SIGINT and SIGHUP): they reach the watcher with the process it watches,
    /// but not the server, which `pg_ctl` starts in a session of its own, so a watcher
    /// that died with the test left the server running.
    fn watch(&self) -> Result<Child, String> {
        let pg_ctl = self.bin.join("pg_ctl");
        let data = self.dir.join("data");
        let stop = match &self.run_as {
            Some(user) => format!(
                "runuser -u {user} -- '{}' -D '{}' -m immediate -w stop",
                pg_ctl.display(),
                data.display()
            ),
            None => format!(
                "'{}' -D '{}' -m immediate -w stop",
                pg_ctl.display(),
                data.display()
            ),
        };
        let script = format!(
            "trap '' TERM INT HUP; cat >/dev/null; {stop} >/dev/null 2>&1; rm -rf '{}'",
            self.dir.display()
        );
        Command::new("sh")
            .arg("-c")
            .arg(script)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("cannot start the cluster's watcher: {e}"))
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
        if let Some(mut watcher) = self.watcher.take() {
            // Closing its input lets it finish the cleanup (the server is already down).
            if let Some(mut input) = watcher.stdin.take() {
                let _ = input.flush();
            }
            let _ = watcher.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The directory holding `initdb` and `pg_ctl`: `PG_BIN`, then PATH, then Debian's
/// `/usr/lib/postgresql/<version>/bin` (the newest version).
fn find_bin() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("PG_BIN") {
        let dir = PathBuf::from(dir);
        if dir.join("initdb").is_file() {
            return Ok(dir);
        }
        return Err(format!(
            "PG_BIN is {} but holds no initdb; {INSTALL_HINT}",
            dir.display()
        ));
    }
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
                return Ok(dir);
            }
        }
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir(root)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let version = entry.file_name().to_str()?.parse::<u32>().ok()?;
            let bin = entry.path().join("bin");
            bin.join("initdb").is_file().then_some((version, bin))
        })
        .collect();
    versions.sort();
    versions
        .pop()
        .map(|(_, bin)| bin)
        .ok_or_else(|| INSTALL_HINT.to_owned())
}

/// `Some(user)` when this process runs as root and PostgreSQL must run as another user.
fn run_as() -> Result<Option<String>, String> {
    let uid = Command::new("id")
        .arg("-u")
        .output()
        .map_err(|e| format!("cannot run id: {e}"))?;
    if String::from_utf8_lossy(&uid.stdout).trim() != "0" {
        return Ok(None);
    }
    let known = Command::new("id")
        .arg("-u")
        .arg(SYSTEM_USER)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .map_err(|e| format!("cannot run id: {e}"))?;
    if !known.success() {
        return Err(format!(
            "the tests run as root, and PostgreSQL refuses to: they run it as the user \
             {SYSTEM_USER:?}, which does not exist; install the postgresql package \
             (`apt-get install -y postgresql`), which creates it"
        ));
    }
    Ok(Some(SYSTEM_USER.to_owned()))
}

/// A loopback port nothing listens on right now.
fn free_port() -> Result<u16, String> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
        .map_err(|e| format!("cannot find a free loopback port: {e}"))?;
    let port = listener
        .local_addr()
        .map_err(|e| format!("cannot find a free loopback port: {e}"))?
        .port();
    drop(listener);
    // Give the kernel a moment to release it.
    std::thread::sleep(Duration::from_millis(1));
    Ok(port)
}
