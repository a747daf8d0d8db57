//! The floor of an h2c request on this machine, with no harness and no actix code: a bare
//! `h2` server on tokio (two worker threads, as the harness has on two cores) that reads
//! each request's body and answers `401` with a small JSON body, as the harness answers a
//! wrong token. `scripts/overload.sh shed` drives it with the same soak as the harness and
//! prints its CPU per request beside the harness's shed and 401 (issue 31).
//!
//! Usage: `h2c_floor ADDRESS`. `GET /requests` (over h2c, e.g. `curl
//! --http2-prior-knowledge`) answers the number of requests answered so far.
#![allow(clippy::print_stderr)]

use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;

static ANSWERED: AtomicU64 = AtomicU64::new(0);

const BODY: &[u8] = br#"{"code":"unauthorized","message":"a valid bearer token is required"}"#;

fn main() -> std::io::Result<()> {
    let Some(address) = std::env::args().nth(1) else {
        eprintln!("usage: h2c_floor ADDRESS");
        std::process::exit(2);
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()?;
    runtime.block_on(async move {
        let listener = tokio::net::TcpListener::bind(&address).await?;
        loop {
            let (socket, _) = listener.accept().await?;
            socket.set_nodelay(true)?;
            tokio::spawn(serve(socket));
        }
    })
}

async fn serve(socket: tokio::net::TcpStream) {
    let Ok(mut connection) = h2::server::handshake(socket).await else {
        return;
    };
    while let Some(Ok((request, respond))) = connection.accept().await {
        tokio::spawn(answer(request, respond));
    }
}

async fn answer(
    request: http::Request<h2::RecvStream>,
    mut respond: h2::server::SendResponse<Bytes>,
) {
    let count = request.uri().path() == "/requests";
    let mut body = request.into_body();
    while let Some(Ok(chunk)) = body.data().await {
        let _ = body.flow_control().release_capacity(chunk.len());
    }
    let (status, body) = if count {
        let answered = ANSWERED.load(Ordering::Relaxed);
        (200, Bytes::from(answered.to_string()))
    } else {
        ANSWERED.fetch_add(1, Ordering::Relaxed);
        (401, Bytes::from_static(BODY))
    };
    let Ok(response) = http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(())
    else {
        return;
    };
    if let Ok(mut send) = respond.send_response(response, false) {
        let _ = send.send_data(body, true);
    }
}
