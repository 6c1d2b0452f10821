//! The few HTTP requests the router makes to authorization servers
//! (metadata, JWKS, introspection): one connection per request, HTTP/1.1,
//! over TLS for `https` (the platform's trust roots plus an optional CA
//! bundle; verification is always on), each bounded in time and size.

use std::time::Duration;

use bytes::Bytes;
use http::{Method, Request, StatusCode, Uri};
use http_body_util::{BodyExt, Full, Limited};
use hyper_util::rt::TokioIo;
use tokio_rustls::rustls::pki_types::ServerName;
use tokio_rustls::TlsConnector;

/// The largest answer read from an authorization server.
pub const MAX_ANSWER_BYTES: usize = 1 << 20;

/// Why a fetch failed (for logs and the refusal's reason).
#[derive(Debug, thiserror::Error)]
pub enum FetchError {
    #[error("{0} is not an http(s) URL with a host")]
    Url(String),
    #[error("cannot connect to {0}: {1}")]
    Connect(String, String),
    #[error("no answer from {0} within {1:?}")]
    Timeout(String, Duration),
    #[error("{0} answered {1}")]
    Status(String, StatusCode),
    #[error("{0}: {1}")]
    Http(String, String),
    #[error("{0}: the answer is larger than {MAX_ANSWER_BYTES} bytes")]
    TooLarge(String),
}

/// An answer as it came, whatever its status (a redirect's `Location`
/// kept).
#[derive(Debug, Clone)]
pub struct Answer {
    pub status: StatusCode,
    pub location: Option<String>,
    /// `WWW-Authenticate`, if it sent one.
    pub challenge: Option<String>,
    pub body: Bytes,
}

/// Makes requests to authorization servers.
#[derive(Clone)]
pub struct Fetcher {
    tls: TlsConnector,
    timeout: Duration,
    egress: switchboard_core::egress::Egress,
}

impl Fetcher {
    /// A fetcher trusting the platform's roots and the certificates of
    /// `extra_ca` (PEM), each request bounded by `timeout`.
    /// Connections go only to addresses `egress` allows.
    pub fn new(
        extra_ca: Option<&[u8]>,
        timeout: Duration,
        egress: switchboard_core::egress::Egress,
    ) -> Result<Fetcher, String> {
        let config = switchboard_core::tls::client_config(extra_ca, None, &[b"http/1.1"])?;
        Ok(Fetcher { tls: TlsConnector::from(config), timeout, egress })
    }

    /// `GET url` (expecting JSON).
    pub async fn get(&self, url: &str) -> Result<Bytes, FetchError> {
        self.send(Method::GET, url, None, None).await
    }

    /// `method url` with `body` of `content_type` (if any) and an
    /// `Authorization` value: the answer whatever its status, redirects
    /// not followed.
    pub async fn fetch(
        &self,
        method: Method,
        url: &str,
        body: Option<(&'static str, Bytes)>,
        auth: Option<String>,
    ) -> Result<Answer, FetchError> {
        match tokio::time::timeout(self.timeout, self.exchange(method, url, body, auth)).await {
            Ok(result) => result,
            Err(_) => Err(FetchError::Timeout(url.to_owned(), self.timeout)),
        }
    }

    /// `POST url` with a JSON body: the answer whatever its status.
    pub async fn post_json(&self, url: &str, body: &serde_json::Value) -> Result<Answer, FetchError> {
        let body = Bytes::from(serde_json::to_vec(body).expect("serializable"));
        self.fetch(Method::POST, url, Some(("application/json", body)), None).await
    }

    /// `POST url` with a form body and HTTP Basic client authentication if
    /// given: the answer whatever its status (a token endpoint's errors
    /// are JSON bodies).
    pub async fn post_form_answer(
        &self,
        url: &str,
        form: &[(&str, &str)],
        basic: Option<(&str, &str)>,
    ) -> Result<Answer, FetchError> {
        let (body, auth) = form_request(form, basic);
        self.fetch(Method::POST, url, Some(("application/x-www-form-urlencoded", body)), auth).await
    }

    /// `POST url` with a form body, optionally with HTTP Basic client
    /// authentication (RFC 6749, section 2.3.1).
    pub async fn post_form(
        &self,
        url: &str,
        form: &[(&str, &str)],
        basic: Option<(&str, &str)>,
    ) -> Result<Bytes, FetchError> {
        let (body, auth) = form_request(form, basic);
        self.send(Method::POST, url, Some(("application/x-www-form-urlencoded", body)), auth).await
    }

    async fn send(
        &self,
        method: Method,
        url: &str,
        body: Option<(&'static str, Bytes)>,
        auth: Option<String>,
    ) -> Result<Bytes, FetchError> {
        let answer = self.fetch(method, url, body, auth).await?;
        if !answer.status.is_success() {
            return Err(FetchError::Status(url.to_owned(), answer.status));
        }
        Ok(answer.body)
    }

    async fn exchange(
        &self,
        method: Method,
        url: &str,
        body: Option<(&'static str, Bytes)>,
        auth: Option<String>,
    ) -> Result<Answer, FetchError> {
        let uri: Uri = url.parse().map_err(|_| FetchError::Url(url.to_owned()))?;
        let https = match uri.scheme_str() {
            Some("https") => true,
            Some("http") => false,
            _ => return Err(FetchError::Url(url.to_owned())),
        };
        let host = uri.host().ok_or_else(|| FetchError::Url(url.to_owned()))?.to_owned();
        let port = uri.port_u16().unwrap_or(if https { 443 } else { 80 });
        let bare = host.trim_start_matches('[').trim_end_matches(']').to_owned();
        let tcp = self
            .egress
            .connect(&bare, port, self.timeout)
            .await
            .map_err(|e| FetchError::Connect(url.to_owned(), e.to_string()))?;
        let mut request = Request::builder()
            .method(method)
            .uri(uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(http::header::HOST, uri.authority().map_or(host.as_str(), |a| a.as_str()))
            .header(http::header::ACCEPT, "application/json")
            .header(http::header::USER_AGENT, concat!("switchboard/", env!("CARGO_PKG_VERSION")));
        let (content_type, body) = body.unwrap_or(("", Bytes::new()));
        if !content_type.is_empty() {
            request = request.header(http::header::CONTENT_TYPE, content_type);
        }
        if let Some(auth) = auth {
            request = request.header(http::header::AUTHORIZATION, auth);
        }
        let request = request.body(Full::new(body)).map_err(|e| FetchError::Http(url.to_owned(), e.to_string()))?;
        let http = |e: hyper::Error| FetchError::Http(url.to_owned(), e.to_string());
        let response = if https {
            let name = ServerName::try_from(bare).map_err(|_| FetchError::Url(url.to_owned()))?;
            let tls =
                self.tls.connect(name, tcp).await.map_err(|e| FetchError::Connect(url.to_owned(), e.to_string()))?;
            send_over(tls, request).await.map_err(http)?
        } else {
            send_over(tcp, request).await.map_err(http)?
        };
        let status = response.status();
        let location = response.headers().get(http::header::LOCATION).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let challenge =
            response.headers().get(http::header::WWW_AUTHENTICATE).and_then(|v| v.to_str().ok()).map(str::to_owned);
        let body = Limited::new(response.into_body(), MAX_ANSWER_BYTES)
            .collect()
            .await
            .map_err(|_| FetchError::TooLarge(url.to_owned()))?
            .to_bytes();
        Ok(Answer { status, location, challenge, body })
    }
}

/// A form body, and the HTTP Basic client authentication (RFC 6749,
/// section 2.3.1: each part form-encoded) if given.
fn form_request(form: &[(&str, &str)], basic: Option<(&str, &str)>) -> (Bytes, Option<String>) {
    let body: String =
        form.iter().map(|(k, v)| format!("{}={}", form_encode(k), form_encode(v))).collect::<Vec<_>>().join("&");
    let auth = basic.map(|(id, secret)| {
        use base64::Engine as _;
        let pair = format!("{}:{}", form_encode(id), form_encode(secret));
        format!("Basic {}", base64::engine::general_purpose::STANDARD.encode(pair))
    });
    (Bytes::from(body), auth)
}

/// One HTTP/1.1 request on a connection of its own.
async fn send_over<I>(
    io: I,
    request: Request<Full<Bytes>>,
) -> Result<http::Response<hyper::body::Incoming>, hyper::Error>
where
    I: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io)).await?;
    tokio::spawn(conn);
    sender.send_request(request).await
}

/// `application/x-www-form-urlencoded` encoding of one name or value.
pub fn form_encode(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.bytes() {
        match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => out.push(b as char),
            b' ' => out.push('+'),
            _ => out.push_str(&format!("%{b:02X}")),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn encodes_forms() {
        assert_eq!(form_encode("a b&c=d/é"), "a+b%26c%3Dd%2F%C3%A9");
        assert_eq!(form_encode("AZaz09-._~"), "AZaz09-._~");
    }

    #[tokio::test]
    async fn refuses_urls_it_cannot_fetch() {
        let f = Fetcher::new(None, Duration::from_secs(1), switchboard_core::egress::Egress::public_only()).unwrap();
        assert!(matches!(f.get("ftp://x/").await, Err(FetchError::Url(_))));
        assert!(matches!(f.get("/relative").await, Err(FetchError::Url(_))));
        let public = switchboard_core::egress::Egress::public_only();
        assert!(Fetcher::new(Some(b"not a pem"), Duration::from_secs(1), public).is_err());
        // The SSRF guard: a loopback authorization server is refused unless allowed.
        let guarded =
            Fetcher::new(None, Duration::from_secs(1), switchboard_core::egress::Egress::public_only()).unwrap();
        let err = guarded.get("http://127.0.0.1:9/.well-known/openid-configuration").await.unwrap_err().to_string();
        assert!(err.contains("loopback address"), "{err}");
    }
}
