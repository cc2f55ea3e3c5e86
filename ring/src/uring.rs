//! io_uring links (Linux): TCP connections whose bytes go through io_uring instead of
//! `read`/`write` calls — the same frames on the wire as `tcp`, so a uring node and a tcp node
//! talk. Each link has a reader thread and a writer thread, each with its own ring:
//! - the reader receives into one registered (pinned once) 1 MiB buffer with `READ_FIXED` and
//!   cuts frames out of the stream;
//! - the writer sends a frame's header and payload as two linked `SEND_ZC` requests in one
//!   submission (zero-copy: the kernel sends from the frame's own memory, which is kept until
//!   the kernel's notification says it is done), or as linked `SEND`s where the kernel has no
//!   zero-copy send.
//!
//! This is fewer system calls and copies per frame, not kernel bypass: the TCP stack still runs.

use std::io::Write;
use std::net::TcpStream;
use std::os::fd::AsRawFd;
use std::sync::mpsc;

use io_uring::{cqueue, opcode, squeue, types, IoUring, Probe};
use tokio::sync::mpsc as tmpsc;

use crate::frame::{Frame, Header, HEADER_LEN};
use crate::link::{FrameRead, FrameWrite, LinkError};

/// Bytes of the reader's registered receive buffer.
const RECV_BUFFER: usize = 1 << 20;

/// Whether io_uring can be used here: `Err` says why not (an old kernel, a sandbox that
/// forbids it, `kernel.io_uring_disabled`).
pub fn available() -> Result<(), String> {
    let ring = IoUring::new(4).map_err(|e| e.to_string())?;
    let mut probe = Probe::new();
    ring.submitter()
        .register_probe(&mut probe)
        .map_err(|e| e.to_string())?;
    if !probe.is_supported(opcode::ReadFixed::CODE) || !probe.is_supported(opcode::Send::CODE) {
        return Err("the kernel's io_uring lacks READ_FIXED or SEND".into());
    }
    Ok(())
}

/// Frames read by the reader thread.
pub(crate) struct UringReader {
    frames: tmpsc::UnboundedReceiver<Result<Frame, LinkError>>,
}

impl FrameRead for UringReader {
    async fn read_frame(&mut self) -> Result<Frame, LinkError> {
        self.frames.recv().await.unwrap_or(Err(LinkError::Closed))
    }
}

/// What the writer thread is asked to do, in order.
enum Job {
    /// Send a frame.
    Send(Frame),
    /// Answer once every frame before is sent.
    Flush(tokio::sync::oneshot::Sender<()>),
}

/// Frames for the writer thread.
pub(crate) struct UringWriter {
    frames: mpsc::Sender<Job>,
}

impl FrameWrite for UringWriter {
    async fn write_frame(&mut self, frame: Frame) -> Result<(), LinkError> {
        // The writer thread ends when its connection fails; the reader reports why.
        self.frames
            .send(Job::Send(frame))
            .map_err(|_| LinkError::Closed)
    }

    async fn flush(&mut self) -> Result<(), LinkError> {
        let (done, sent) = tokio::sync::oneshot::channel();
        self.frames
            .send(Job::Flush(done))
            .map_err(|_| LinkError::Closed)?;
        sent.await.map_err(|_| LinkError::Closed)
    }
}

/// Starts the reader and writer threads of a connected stream.
pub(crate) fn split(
    stream: TcpStream,
    max_payload: u32,
) -> std::io::Result<(UringReader, UringWriter)> {
    stream.set_nonblocking(false)?;
    stream.set_nodelay(true)?;
    let write_half = stream.try_clone()?;
    let read_ring = IoUring::new(4)?;
    let write_ring = IoUring::new(8)?;
    let mut buf = vec![0u8; RECV_BUFFER];
    let iov = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: buf.len(),
    };
    // SAFETY: `buf` (never resized, so its memory stays put) is moved into the reader thread
    // with `read_ring` and outlives every request that uses it.
    unsafe { read_ring.submitter().register_buffers(&[iov])? };
    let mut probe = Probe::new();
    write_ring.submitter().register_probe(&mut probe)?;
    let zero_copy = probe.is_supported(opcode::SendZc::CODE);
    let (tx, frames) = tmpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("hesper-ring-uring-rx".into())
        .spawn(move || read_loop(read_ring, buf, &stream, max_payload, &tx))?;
    let (out, queue) = mpsc::channel::<Job>();
    std::thread::Builder::new()
        .name("hesper-ring-uring-tx".into())
        .spawn(move || write_loop(write_ring, write_half, zero_copy, &queue))?;
    Ok((UringReader { frames }, UringWriter { frames: out }))
}

/// Receives into the registered buffer and hands on each whole frame.
fn read_loop(
    mut ring: IoUring,
    mut buf: Vec<u8>,
    stream: &TcpStream,
    max_payload: u32,
    out: &tmpsc::UnboundedSender<Result<Frame, LinkError>>,
) {
    let fd = types::Fd(stream.as_raw_fd());
    let mut pending: Vec<u8> = Vec::new();
    loop {
        let read = opcode::ReadFixed::new(fd, buf.as_mut_ptr(), buf.len() as u32, 0)
            .build()
            .user_data(1);
        // SAFETY: the request reads into `buf`, registered as buffer 0, which lives until
        // this function returns; the completion is awaited before `buf` is touched again.
        let n = unsafe { submit_one(&mut ring, &read) };
        let n = match n {
            Ok(0) => return drop(out.send(Err(LinkError::Closed))),
            Ok(n) => n,
            Err(e) => return drop(out.send(Err(e.into()))),
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some(head) = pending.first_chunk::<HEADER_LEN>() {
            let header = match Header::decode(head, max_payload) {
                Ok(h) => h,
                Err(e) => return drop(out.send(Err(e.into()))),
            };
            let end = HEADER_LEN + header.len as usize;
            if pending.len() < end {
                break;
            }
            let payload = pending[HEADER_LEN..end].to_vec();
            pending.drain(..end);
            if out.send(Ok(Frame { header, payload })).is_err() {
                return;
            }
        }
    }
}

/// Pushes one request, waits for its completion and returns its result.
///
/// # Safety
/// The buffers the request points at must stay valid until this returns.
unsafe fn submit_one(ring: &mut IoUring, entry: &squeue::Entry) -> std::io::Result<usize> {
    // SAFETY: the caller keeps the request's buffers alive until its completion, awaited here.
    unsafe { ring.submission().push(entry) }.map_err(std::io::Error::other)?;
    ring.submit_and_wait(1)?;
    let cqe = ring
        .completion()
        .next()
        .ok_or_else(|| std::io::Error::other("io_uring returned no completion"))?;
    usize::try_from(cqe.result()).map_err(|_| std::io::Error::from_raw_os_error(-cqe.result()))
}

/// Sends each queued frame: header and payload as two linked requests in one submission.
fn write_loop(
    mut ring: IoUring,
    mut stream: TcpStream,
    zero_copy: bool,
    queue: &mpsc::Receiver<Job>,
) {
    let fd = types::Fd(stream.as_raw_fd());
    for job in queue {
        let frame = match job {
            Job::Send(frame) => frame,
            Job::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        };
        let head = frame.header.encode();
        let parts: [&[u8]; 2] = [&head, &frame.payload];
        let parts = &parts[..if frame.payload.is_empty() { 1 } else { 2 }];
        let mut results = vec![0i32; parts.len()];
        let mut notifications = 0;
        for (i, part) in parts.iter().enumerate() {
            let entry = if zero_copy {
                opcode::SendZc::new(fd, part.as_ptr(), part.len() as u32).build()
            } else {
                opcode::Send::new(fd, part.as_ptr(), part.len() as u32).build()
            };
            let flags = if i + 1 < parts.len() {
                squeue::Flags::IO_LINK
            } else {
                squeue::Flags::empty()
            };
            // SAFETY: `head` and `frame` outlive the requests: this iteration waits below for
            // every completion and every zero-copy notification before dropping them.
            if unsafe {
                ring.submission()
                    .push(&entry.flags(flags).user_data(i as u64))
            }
            .is_err()
            {
                return;
            }
        }
        let mut done = 0;
        while done < parts.len() || notifications > 0 {
            if ring.submit_and_wait(1).is_err() {
                return;
            }
            for cqe in ring.completion() {
                if cqueue::notif(cqe.flags()) {
                    notifications -= 1;
                    continue;
                }
                if cqueue::more(cqe.flags()) {
                    notifications += 1;
                }
                results[cqe.user_data() as usize] = cqe.result();
                done += 1;
            }
        }
        // A short or cancelled send (a broken link in the chain) is finished with plain
        // writes from where the kernel stopped; an error ends the link.
        for (part, &sent) in parts.iter().zip(&results) {
            let sent = match usize::try_from(sent) {
                Ok(n) => n,
                Err(_) if sent == -libc::ECANCELED => 0,
                Err(_) => return,
            };
            if sent < part.len() && stream.write_all(&part[sent..]).is_err() {
                return;
            }
        }
    }
}
