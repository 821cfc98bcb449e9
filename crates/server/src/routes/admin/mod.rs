//! Admin handlers: [`events`] (order-event sinks: positions, lag, re-delivery),
//! [`reconcile`] (reports and repairs), [`gateway`] (the blacklist, token-only
//! sales and the purchase-token route), [`risk`] (the risk allowlist and a sale's fallback rule).

/// A flag an admin turns on with `PUT` and off with `DELETE` at one path: the two handlers
/// with their OpenAPI, each answering `$set(&st, p, on)` (`p` the path parameter, of type
/// `$p`, described by `$param`).
macro_rules! flag_routes {
    (
        $path:tt, $param:tt, $p:tt => $view:ident, $set:ident,
        put $on:ident = $on_id:tt ($on_said:tt),
        delete $off:ident = $off_id:tt ($off_said:tt) $(,)?
    ) => {
        #[utoipa::path(put, path = $path, tag = "admin", operation_id = $on_id, security(("bearer" = [])),
            params($param), responses((status = 200, description = $on_said, body = $view)))]
        pub async fn $on(AdminOn { st, p, .. }: AdminOn<$p>) -> Answer<$view> {
            $set(&st, p, true).await
        }

        #[utoipa::path(delete, path = $path, tag = "admin", operation_id = $off_id, security(("bearer" = [])),
            params($param), responses((status = 200, description = $off_said, body = $view)))]
        pub async fn $off(AdminOn { st, p, .. }: AdminOn<$p>) -> Answer<$view> {
            $set(&st, p, false).await
        }
    };
}

pub mod events;
pub mod gateway;
pub mod reconcile;
pub mod risk;
