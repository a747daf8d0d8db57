//! Bearer-token authentication of the `/v1` routes, compared in constant time.

use actix_web::HttpRequest;
use subtle::ConstantTimeEq;

use super::error::ApiError;

/// Checks `Authorization: Bearer <token>`. An empty configured token means no auth, which
/// `serve` allows only on a loopback address.
pub fn authorize(request: &HttpRequest, token: &str) -> Result<(), ApiError> {
    if token.is_empty() {
        return Ok(());
    }
    let presented = request
        .headers()
        .get(actix_web::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .unwrap_or("");
    if bool::from(presented.as_bytes().ct_eq(token.as_bytes())) {
        Ok(())
    } else {
        Err(ApiError::Unauthorized)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use actix_web::test::TestRequest;

    #[test]
    fn only_the_exact_bearer_token_passes() {
        let ok = TestRequest::default()
            .insert_header(("Authorization", "Bearer s3cret"))
            .to_http_request();
        assert!(authorize(&ok, "s3cret").is_ok());
        for bad in [
            "Bearer s3cre",
            "Bearer s3cret2",
            "bearer s3cret",
            "s3cret",
            "Basic czNjcmV0",
        ] {
            let req = TestRequest::default()
                .insert_header(("Authorization", bad))
                .to_http_request();
            assert!(authorize(&req, "s3cret").is_err(), "{bad}");
        }
        assert!(authorize(&TestRequest::default().to_http_request(), "s3cret").is_err());
        assert!(authorize(&TestRequest::default().to_http_request(), "").is_ok());
    }
}
