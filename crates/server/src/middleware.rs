//! The middleware over the shared state, outermost first: [`count_requests`] (every answer by
//! route and status), [`caps`] (header caps, in-flight cap, request timeout) and
//! [`rate_headers`] (the `RateLimit` headers of user routes). The work is the gateway's; these
//! only hand it the state's parts.

use axum::extract::{MatchedPath, Request, State};
use axum::middleware::Next;
use axum::response::Response;

use crate::gateway::{caps, ratelimit};
use crate::hot_metrics;
use crate::state::AppState;

/// Counts every answer by route template and status.
pub async fn count_requests(State(_): State<AppState>, req: Request, next: Next) -> Response {
    let route = req.extensions().get::<MatchedPath>().cloned();
    let response = next.run(req).await;
    let route = route.as_ref().map_or("unmatched", MatchedPath::as_str);
    hot_metrics::http_request(route, response.status().as_u16());
    response
}

/// Header caps, the in-flight cap and the request timeout, in the API's error shape.
pub async fn caps(State(st): State<AppState>, req: Request, next: Next) -> Response {
    caps::enforce(&st.gateway, st.tunables.request_timeout, req, next).await
}

/// `RateLimit-Policy` and `RateLimit` on the answers of requests that met a rate limit.
pub async fn rate_headers(State(st): State<AppState>, req: Request, next: Next) -> Response {
    ratelimit::headers(&st.gateway.rates, req, next).await
}
