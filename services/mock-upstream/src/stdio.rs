//! The mock over stdio: one JSON message per line on stdin and stdout.

use std::sync::Arc;

use bytes::Bytes;
use switchboard_protocol::ndjson;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::mpsc;

use crate::mcp::{Reply, Server};

pub(crate) async fn serve(server: Arc<Server>) -> std::io::Result<()> {
    let (out_tx, mut out_rx) = mpsc::unbounded_channel::<Bytes>();
    let writer = tokio::spawn(async move {
        let mut stdout = tokio::io::stdout();
        while let Some(message) = out_rx.recv().await {
            if stdout.write_all(&ndjson::encode(&message)).await.is_err() {
                break;
            }
            if out_rx.is_empty() && stdout.flush().await.is_err() {
                break;
            }
        }
    });
    server.shared().set_unsolicited(out_tx.clone());

    let mut stdin = tokio::io::stdin();
    let mut decoder = ndjson::Decoder::new(64 << 20);
    let mut chunk = vec![0u8; 64 * 1024];
    loop {
        let n = stdin.read(&mut chunk).await?;
        if n == 0 {
            break;
        }
        decoder.push(&chunk[..n]);
        loop {
            let line = match decoder.next_line() {
                Ok(Some(line)) => line,
                Ok(None) => break,
                Err(e) => {
                    eprintln!("mock: {e}");
                    continue;
                }
            };
            let server = server.clone();
            let out = out_tx.clone();
            tokio::spawn(async move {
                match server.handle(server.shared(), line).await {
                    Reply::Accepted => {}
                    Reply::Json(bytes) | Reply::Invalid(bytes) => {
                        let _ = out.send(bytes);
                    }
                    Reply::Stream(mut rx) | Reply::Polled(mut rx) => {
                        while let Some(message) = rx.recv().await {
                            let _ = out.send(message);
                        }
                    }
                }
            });
        }
    }
    drop(out_tx);
    server.shared().clear_unsolicited();
    let _ = writer.await;
    Ok(())
}
