//! Reading an HTTP body whole, within a size limit: requests from clients,
//! answers from upstreams.

use bytes::{Bytes, BytesMut};
use http_body_util::BodyExt;

/// Why a body could not be read whole.
#[derive(Debug)]
pub enum CollectError<E> {
    /// It is longer than the limit.
    TooLarge,
    /// The connection failed while reading it.
    Read(E),
}

/// Reads a whole body of at most `limit` bytes. A body that arrives in one
/// chunk (the common case for JSON-RPC messages) is returned as that chunk,
/// without copying or allocating.
pub async fn collect<B>(body: &mut B, limit: usize) -> Result<Bytes, CollectError<B::Error>>
where
    B: http_body::Body<Data = Bytes> + Unpin,
{
    let mut first: Option<Bytes> = None;
    let mut joined: Option<BytesMut> = None;
    let mut total = 0usize;
    while let Some(frame) = body.frame().await {
        let Ok(data) = frame.map_err(CollectError::Read)?.into_data() else { continue };
        total += data.len();
        if total > limit {
            return Err(CollectError::TooLarge);
        }
        if let Some(joined) = joined.as_mut() {
            joined.extend_from_slice(&data);
        } else if let Some(head) = first.take() {
            let mut both = BytesMut::with_capacity(total.max(head.len() + data.len()));
            both.extend_from_slice(&head);
            both.extend_from_slice(&data);
            joined = Some(both);
        } else {
            first = Some(data);
        }
    }
    Ok(joined.map(BytesMut::freeze).or(first).unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn collect_returns_a_single_chunk_as_is_and_refuses_oversized_bodies() {
        let one = http_body_util::Full::new(Bytes::from_static(b"{\"a\":1}"));
        let mut one = one;
        assert_eq!(&collect(&mut one, 100).await.unwrap()[..], b"{\"a\":1}");
        let mut big = http_body_util::Full::new(Bytes::from(vec![b'x'; 200]));
        assert!(matches!(collect(&mut big, 100).await, Err(CollectError::TooLarge)));
    }
}
