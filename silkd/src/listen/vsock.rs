//! `vsock:PORT` listener (any CID), for hosts with `/dev/vhost-vsock`.

use tokio_vsock::{VsockAddr, VsockListener, VMADDR_CID_ANY};

use crate::{Error, Result};

pub(super) fn bind(port: u32) -> Result<VsockListener> {
    VsockListener::bind(VsockAddr::new(VMADDR_CID_ANY, port))
        .map_err(|e| Error::io(format!("binding vsock port {port}"), e))
}
