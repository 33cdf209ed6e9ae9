//! Control plane, the admin API: a command sent to the controller and its answer
//! awaited, for every room of `surfaces/` that asks the controller.

use hyper::StatusCode;
use tokio::sync::{mpsc, oneshot};

use crate::control::http::{error, Reply};
use crate::control::levers::command::Command;

/// Sends a command to the controller and waits for its answer.
pub(crate) async fn ask<T>(
    commands: &mpsc::Sender<Command>,
    make: impl FnOnce(oneshot::Sender<T>) -> Command,
) -> Result<T, Box<Reply>> {
    let unavailable = |why: &str| Box::new(error(StatusCode::SERVICE_UNAVAILABLE, why));
    let (tx, rx) = oneshot::channel();
    if commands.send(make(tx)).await.is_err() {
        return Err(unavailable("the controller is not running"));
    }
    rx.await
        .map_err(|_| unavailable("the controller did not answer"))
}
