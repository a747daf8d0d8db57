//! The front door with `server.accept_h2c`: HTTP/1.1 and HTTP/2 without TLS (prior
//! knowledge) on one listener, bounded where actix-web's own h2c is not.
//!
//! actix-web tells the two apart by waiting for a connection's first bytes with no time
//! limit, and serves HTTP/2 with h2's defaults: no `SETTINGS_MAX_CONCURRENT_STREAMS`, a
//! 16 MiB header list (30,000 header names panicked h2's decoder, the map it fills holds
//! 32,768). Here each connection must send its first bytes within
//! `server.client_request_timeout_ms` or is closed; HTTP/1.1 then goes to actix-http's own
//! HTTP/1.1 dispatcher (with its timeouts), and HTTP/2 to an h2 server announcing
//! `server.h2_max_concurrent_streams` and a header list capped at [`MAX_HEADER_LIST_BYTES`]
//! (a larger one is answered 431), whose streams call the same App service. An HTTP/2
//! connection with no stream open for `server.client_request_timeout_ms` is closed.
//!
//! Entry point: [`service`], the per-worker service factory for actix-server.

use std::cell::Cell;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::time::Duration;

use actix_http::body::{BodySize, BoxBody, MessageBody};
use actix_http::header::{HeaderValue, CONNECTION, CONTENT_LENGTH, TRANSFER_ENCODING, UPGRADE};
use actix_http::{HttpService, Method, Payload, Request, Response};
use actix_rt::net::TcpStream;
use actix_service::{fn_factory, fn_service, Service, ServiceFactory};
use bytes::Bytes;
use h2_03 as h2;

/// The HTTP/2 connection preface a client with prior knowledge sends first (RFC 9113 §3.4).
const PREFACE: &[u8; 24] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// The largest HTTP/2 header list accepted, as h2 counts it (each field's name and value
/// plus 32 bytes), like the head actix-web's HTTP/1.1 accepts.
pub const MAX_HEADER_LIST_BYTES: u32 = 128 * 1024;

/// Bounds of the front door (from `server.*`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// `server.client_request_timeout_ms`: the first bytes, the HTTP/2 handshake and an
    /// idle HTTP/2 connection are given this long.
    pub first_bytes: Duration,
    /// `server.h2_max_concurrent_streams`, announced in SETTINGS.
    pub max_concurrent_streams: u32,
}

/// The App's service, shared by a worker's HTTP/1.1 dispatchers and HTTP/2 streams.
pub type AppService =
    actix_service::boxed::BoxService<Request, Response<BoxBody>, Response<BoxBody>>;

/// The service of one worker: `app` makes the worker's App service once (its registry, its
/// connections); every connection accepted on the worker then goes through the front door.
pub fn service<F, Fut>(
    app: F,
    limits: Limits,
    local_addr: SocketAddr,
) -> impl ServiceFactory<TcpStream, Config = (), Response = (), Error = (), InitError = ()>
where
    F: Fn() -> Fut + 'static,
    Fut: Future<Output = Result<AppService, ()>> + 'static,
{
    let app = Rc::new(app);
    fn_factory(move || {
        let app = app.clone();
        async move {
            let app = Rc::new(app().await?);
            let shared = app.clone();
            let h1 = HttpService::<TcpStream, _, _, _, _>::build()
                .client_request_timeout(limits.first_bytes)
                .local_addr(local_addr)
                .h1(fn_factory(move || {
                    let app = Shared(shared.clone());
                    async move { Ok::<_, ()>(app) }
                }))
                .tcp()
                .new_service(())
                .await
                .map_err(|_| ())?;
            let h1 = Rc::new(h1);
            Ok(fn_service(move |stream: TcpStream| {
                let (h1, app) = (h1.clone(), app.clone());
                async move {
                    serve(stream, h1, app, limits).await;
                    Ok::<_, ()>(())
                }
            }))
        }
    })
}

/// One connection: the first bytes within the limit, then HTTP/1.1 or HTTP/2.
async fn serve<H1>(stream: TcpStream, h1: Rc<H1>, app: Rc<AppService>, limits: Limits)
where
    H1: Service<TcpStream>,
{
    match tokio::time::timeout(limits.first_bytes, speaks_h2(&stream)).await {
        Ok(Some(true)) => serve_h2(stream, app, limits).await,
        Ok(Some(false)) => {
            let _ = h1.call(stream).await;
        }
        // Nothing in time, or the connection failed: dropping it closes it.
        Ok(None) | Err(_) => {}
    }
}

/// Whether the connection opens with the HTTP/2 preface (`None`: it closed or failed
/// first). Peeks, so the bytes stay for whichever protocol reads them.
async fn speaks_h2(stream: &TcpStream) -> Option<bool> {
    let mut first = [0u8; PREFACE.len()];
    loop {
        let n = stream.peek(&mut first).await.ok()?;
        if n == 0 {
            return None;
        }
        if first[..n] != PREFACE[..n] {
            return Some(false);
        }
        if n == PREFACE.len() {
            return Some(true);
        }
        // Part of the preface so far: wait a moment for the rest (the caller's timeout
        // bounds this).
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

async fn serve_h2(stream: TcpStream, app: Rc<AppService>, limits: Limits) {
    let peer = stream.peer_addr().ok();
    let handshake = h2::server::Builder::new()
        .max_concurrent_streams(limits.max_concurrent_streams)
        .max_header_list_size(MAX_HEADER_LIST_BYTES)
        .handshake::<_, Bytes>(stream);
    let Ok(Ok(mut connection)) = tokio::time::timeout(limits.first_bytes, handshake).await else {
        return;
    };
    let open = Rc::new(Cell::new(0usize));
    loop {
        let next = match tokio::time::timeout(limits.first_bytes, connection.accept()).await {
            Ok(next) => next,
            // Streams still open: keep serving them.
            Err(_) if open.get() > 0 => continue,
            Err(_) => {
                connection.graceful_shutdown();
                let closed = poll_fn(|cx| connection.poll_closed(cx));
                let _ = tokio::time::timeout(limits.first_bytes, closed).await;
                return;
            }
        };
        let Some(Ok((request, respond))) = next else {
            return;
        };
        open.set(open.get() + 1);
        let (app, open) = (app.clone(), open.clone());
        actix_rt::spawn(async move {
            answer(request, respond, &app, peer).await;
            open.set(open.get() - 1);
        });
    }
}

/// One HTTP/2 stream through the App service.
async fn answer(
    request: http_02::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
    app: &AppService,
    peer: Option<SocketAddr>,
) {
    let (parts, body) = request.into_parts();
    let head_only = parts.method == Method::HEAD;
    let mut req = Request::with_payload(Payload::from(body));
    let head = req.head_mut();
    head.uri = parts.uri;
    head.method = parts.method;
    head.version = parts.version;
    head.headers = parts.headers.into();
    head.peer_addr = peer;
    let response = match app.call(req).await {
        Ok(response) | Err(response) => response,
    };
    let (response, body) = response.into_parts();
    let mut size = body.size();
    let mut head = http_02::Response::new(());
    *head.status_mut() = response.status();
    *head.version_mut() = http_02::Version::HTTP_2;
    for (name, value) in response.headers().iter() {
        if name != CONNECTION
            && name != TRANSFER_ENCODING
            && name != UPGRADE
            && name != CONTENT_LENGTH
        {
            head.headers_mut().append(name.clone(), value.clone());
        }
    }
    if response.status() == http_02::StatusCode::NO_CONTENT {
        size = BodySize::None;
    }
    if let BodySize::Sized(len) = size {
        if let Ok(value) = HeaderValue::from_str(itoa::Buffer::new().format(len)) {
            head.headers_mut().insert(CONTENT_LENGTH, value);
        }
    }
    let end = head_only || matches!(size, BodySize::None | BodySize::Sized(0));
    let Ok(mut stream) = respond.send_response(head, end) else {
        return;
    };
    if end {
        return;
    }
    let mut body = pin!(body);
    while let Some(chunk) = poll_fn(|cx| body.as_mut().poll_next(cx)).await {
        let Ok(mut chunk) = chunk else { return };
        while !chunk.is_empty() {
            stream.reserve_capacity(chunk.len());
            let room = match poll_fn(|cx| stream.poll_capacity(cx)).await {
                Some(Ok(room)) => room,
                None | Some(Err(_)) => return,
            };
            let part = chunk.split_to(room.min(chunk.len()));
            if stream.send_data(part, false).is_err() {
                return;
            }
        }
    }
    let _ = stream.send_data(Bytes::new(), true);
}

/// The worker's App service, shared (actix-http's HTTP/1.1 dispatcher takes a factory).
struct Shared(Rc<AppService>);

impl Service<Request> for Shared {
    type Response = Response<BoxBody>;
    type Error = Response<BoxBody>;
    type Future =
        std::pin::Pin<Box<dyn Future<Output = Result<Response<BoxBody>, Response<BoxBody>>>>>;

    fn poll_ready(
        &self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.0.poll_ready(cx)
    }

    fn call(&self, req: Request) -> Self::Future {
        self.0.call(req)
    }
}
