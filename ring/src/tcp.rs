//! TCP links (tokio): `TCP_NODELAY`, 8 MiB socket buffers, header and payload in one
//! vectored write.

use std::io::IoSlice;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};

use crate::frame::{Frame, Header, HEADER_LEN};
use crate::link::{FrameRead, FrameWrite, LinkError};

/// Socket buffer size asked of the kernel (it may grant less).
const SOCKET_BUFFER: u32 = 8 << 20;

/// Reads frames from a TCP stream.
pub(crate) struct TcpReader {
    stream: OwnedReadHalf,
    max_payload: u32,
}

impl FrameRead for TcpReader {
    async fn read_frame(&mut self) -> Result<Frame, LinkError> {
        let mut head = [0u8; HEADER_LEN];
        match self.stream.read_exact(&mut head).await {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => {
                return Err(LinkError::Closed)
            }
            Err(e) => return Err(e.into()),
        }
        // The length is checked against the limit before the payload is allocated.
        let header = Header::decode(&head, self.max_payload)?;
        let mut payload = vec![0u8; header.len as usize];
        self.stream.read_exact(&mut payload).await?;
        Ok(Frame { header, payload })
    }
}

/// Writes frames to a TCP stream.
pub(crate) struct TcpWriter {
    stream: OwnedWriteHalf,
}

impl FrameWrite for TcpWriter {
    async fn write_frame(&mut self, frame: Frame) -> Result<(), LinkError> {
        let head = frame.header.encode();
        let mut parts = [IoSlice::new(&head), IoSlice::new(&frame.payload)];
        let mut slices = &mut parts[..];
        while !slices.is_empty() {
            let n = self.stream.write_vectored(slices).await?;
            if n == 0 {
                return Err(LinkError::Closed);
            }
            IoSlice::advance_slices(&mut slices, n);
        }
        Ok(())
    }
}

/// A bound TCP listener with the ring's socket settings.
pub(crate) fn listen(addr: SocketAddr) -> std::io::Result<TcpListener> {
    let socket = socket_for(addr)?;
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(16)
}

/// Connects to `addr` with the ring's socket settings, retrying with back-off (0.05 s
/// doubling to 1 s) while the ring forms, for at most `wait`.
pub(crate) async fn connect_with_backoff(
    addr: SocketAddr,
    wait: Duration,
) -> std::io::Result<TcpStream> {
    let deadline = Instant::now() + wait;
    let mut backoff = Duration::from_millis(50);
    loop {
        match socket_for(addr)?.connect(addr).await {
            Ok(s) => return Ok(s),
            Err(e) if Instant::now() + backoff >= deadline => return Err(e),
            Err(_) => {
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(1));
            }
        }
    }
}

fn socket_for(addr: SocketAddr) -> std::io::Result<TcpSocket> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    socket.set_send_buffer_size(SOCKET_BUFFER)?;
    socket.set_recv_buffer_size(SOCKET_BUFFER)?;
    Ok(socket)
}

/// Splits an accepted or connected stream into frame reader and writer.
pub(crate) fn split(
    stream: TcpStream,
    max_payload: u32,
) -> std::io::Result<(TcpReader, TcpWriter)> {
    stream.set_nodelay(true)?;
    let (r, w) = stream.into_split();
    Ok((
        TcpReader {
            stream: r,
            max_payload,
        },
        TcpWriter { stream: w },
    ))
}
