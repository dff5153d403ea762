//! The tasks both ends of a TCP zone connection run (`tcp`, `upstream::zone_tcp`): one writer
//! that owns the connection's write half, pumps that turn a byte stream into data frames as
//! credit allows, and pumps that write received data frames to a byte stream and grant the
//! window back as they do.

use std::sync::Arc;

use serde::Serialize;
use tokio::{
    io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt},
    sync::mpsc,
};

use super::frames::{self, Budget, Chan, Credit, GRANT_AT, MAX_FRAME, write_frame};

/// A frame to send.
pub type Frame = (Chan, Vec<u8>);

/// Writes queued frames until the queue closes or the connection fails; then closes it.
pub async fn write_frames(mut writer: impl AsyncWrite + Unpin, mut queued: mpsc::Receiver<Frame>) {
    while let Some((chan, payload)) = queued.recv().await {
        if write_frame(&mut writer, chan, &payload).await.is_err() {
            return;
        }
    }
    let _ = writer.shutdown().await;
}

/// Reads a stream into frames of `chan`, as credit allows; an empty frame at its end.
pub async fn pump_out(
    mut from: impl AsyncRead + Unpin,
    chan: Chan,
    credit: Arc<Credit>,
    out: mpsc::Sender<Frame>,
) {
    let mut buf = vec![0u8; MAX_FRAME];
    loop {
        let Some(room) = credit.take(MAX_FRAME).await else {
            return;
        };
        let n = from.read(&mut buf[..room]).await.unwrap_or(0);
        if n < room {
            let _ = credit.grant(room - n);
        }
        if out.send((chan, buf[..n].to_vec())).await.is_err() || n == 0 {
            return;
        }
    }
}

/// Writes received data (`chunks`, counted in `budget`) to `to`, sending `grant(bytes)` as a
/// control message for every [`GRANT_AT`] bytes written; an empty chunk closes `to`. After a
/// failed write (nobody reads any more) the rest is consumed unwritten, so the sender is never
/// stuck.
pub async fn pump_in<W, G>(
    mut to: Option<W>,
    mut chunks: mpsc::UnboundedReceiver<Vec<u8>>,
    budget: Arc<Budget>,
    out: mpsc::Sender<Frame>,
    grant: impl Fn(u32) -> G,
) where
    W: AsyncWrite + Unpin,
    G: Serialize,
{
    let mut ungranted = 0;
    while let Some(chunk) = chunks.recv().await {
        if chunk.is_empty() {
            if let Some(mut pipe) = to.take() {
                let _ = pipe.shutdown().await;
            }
            continue;
        }
        if let Some(pipe) = &mut to
            && pipe.write_all(&chunk).await.is_err()
        {
            to = None;
        }
        ungranted += chunk.len();
        if ungranted >= GRANT_AT {
            budget.consumed(ungranted);
            let message = grant(u32::try_from(ungranted).unwrap_or(u32::MAX));
            ungranted = 0;
            let Ok(message) = frames::control_of(&message) else {
                return;
            };
            if out.send((Chan::Control, message)).await.is_err() {
                return;
            }
        }
    }
}
