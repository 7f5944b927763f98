//! This process's stdin and stdout for the stdio bridge, without a thread per operation.
//!
//! tokio's `stdin()` and `stdout()` run every read and write on a thread of the blocking
//! pool, two wake-ups between threads each. An MCP client gives its server a pipe or a
//! socket, which the runtime can poll itself: those are made non-blocking and read and
//! written on the runtime's own thread. Anything else (a file, a terminal) goes through
//! tokio's, as before. The mode belongs to the bridge's end of each pipe or socket; the
//! client's end keeps its own. (A client that hands the bridge its stdout pipe as stderr
//! too would see a log line dropped when that pipe is full, rather than the bridge wait.)

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileTypeExt as _;

use tokio::io::{AsyncRead, AsyncWrite};

/// How a standard stream is reached.
enum Kind {
    Pipe,
    Socket,
    Other,
}

/// A duplicate of `stream`'s descriptor and what it is; `None` if it cannot be told.
fn duplicate(stream: impl AsFd) -> Option<(OwnedFd, Kind)> {
    let fd = stream.as_fd().try_clone_to_owned().ok()?;
    let kind = File::from(fd.try_clone().ok()?)
        .metadata()
        .ok()?
        .file_type();
    let kind = if kind.is_fifo() {
        Kind::Pipe
    } else if kind.is_socket() {
        Kind::Socket
    } else {
        Kind::Other
    };
    Some((fd, kind))
}

/// A socket descriptor as a non-blocking tokio stream (any stream socket reads and writes
/// as a Unix one does).
fn nonblocking_socket(fd: OwnedFd) -> std::io::Result<tokio::net::UnixStream> {
    let socket = std::os::unix::net::UnixStream::from(fd);
    socket.set_nonblocking(true)?;
    tokio::net::UnixStream::from_std(socket)
}

/// Back to blocking mode, for tokio's own stdin or stdout (a thread of its blocking pool
/// waits on it): a conversion that failed may have made the descriptor non-blocking.
fn blocking(stream: impl AsFd) {
    if let Ok(fd) = stream.as_fd().try_clone_to_owned() {
        // std sets the mode with `ioctl(FIONBIO)`, which Linux applies to any descriptor.
        let _ = std::os::unix::net::UnixStream::from(fd).set_nonblocking(false);
    }
}

/// `stream()` polled by the runtime: through `pipe` if it is a pipe, `socket` if it is a
/// socket; `None` for anything else, or if the conversion failed (the stream is left
/// blocking then).
fn polled<S: AsFd, T>(
    stream: fn() -> S,
    pipe: impl FnOnce(OwnedFd) -> std::io::Result<T>,
    socket: impl FnOnce(tokio::net::UnixStream) -> T,
) -> Option<T> {
    let converted = match duplicate(stream())? {
        (fd, Kind::Pipe) => pipe(fd),
        (fd, Kind::Socket) => nonblocking_socket(fd).map(socket),
        (_, Kind::Other) => return None,
    };
    converted.inspect_err(|_| blocking(stream())).ok()
}

/// This process's stdin, read on the runtime's thread when it is a pipe or a socket.
/// Call it inside the runtime.
pub(crate) fn stdin() -> Box<dyn AsyncRead + Send + Unpin> {
    polled::<_, Box<dyn AsyncRead + Send + Unpin>>(
        std::io::stdin,
        |fd| Ok(Box::new(tokio::net::unix::pipe::Receiver::from_owned_fd(fd)?) as _),
        |socket| Box::new(socket) as _,
    )
    .unwrap_or_else(|| Box::new(tokio::io::stdin()))
}

/// This process's stdout, written on the runtime's thread when it is a pipe or a socket.
/// Call it inside the runtime.
pub(crate) fn stdout() -> Box<dyn AsyncWrite + Send + Unpin> {
    polled::<_, Box<dyn AsyncWrite + Send + Unpin>>(
        std::io::stdout,
        |fd| Ok(Box::new(tokio::net::unix::pipe::Sender::from_owned_fd(fd)?) as _),
        |socket| Box::new(socket) as _,
    )
    .unwrap_or_else(|| Box::new(tokio::io::stdout()))
}
