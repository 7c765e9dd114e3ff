//! The verbs objects behind exposures that `sideway` does not wrap: registrations of one
//! exposed range ([`RangeRegistration`]: `ibv_reg_mr`, `ibv_dereg_mr`), type 2 memory
//! windows bound over them ([`MemoryWindow`]: `ibv_alloc_mw`, a bind work request,
//! `ibv_dealloc_mw`), and the work requests of a send queue through the extended posting
//! interface (`ibv_wr_start` … `ibv_wr_complete`), which both the endpoint's own requests
//! and window binds go through.
//!
//! Every exposure registers its range alone. With windows the registration has no remote
//! right, only the right to bind a window, and the window, bound to the connection's queue
//! pair, carries the remote right and the key; without, the registration carries both.
//! A window over the whole region would do where the device bounds an access by the
//! window, but soft-RoCE bounds it by the window's registration (Linux's `rxe_resp.c`,
//! `check_rkey`, to this day): over the region, a peer could reach all of it.
//!
//! # Invariants
//!
//! - A window or registration is undone exactly once: by [`MemoryWindow::deallocate`] or
//!   [`RangeRegistration::deregister`] (revocation, which reports a failure), else when
//!   it drops. Each holds its protection domain by `Arc`, so the domain outlives it.
//! - Undoing is synchronous: once `ibv_dealloc_mw` (which unbinds a bound window) or
//!   `ibv_dereg_mr` has returned 0, the device refuses the key, and no access through it
//!   is still touching memory. Revocation relies on this rather than on a local
//!   invalidation work request, which would wait on the send queue behind sends that may
//!   wait for the peer's receives for as long as the peer likes.
//! - A bound window holds a reference to the registration it lies in (the device refuses
//!   to deregister it while a window lies in it), so a window is deallocated before its
//!   range's registration is deregistered.

use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

use rdma_mummy_sys::{
    ibv_access_flags, ibv_alloc_mw, ibv_dealloc_mw, ibv_dereg_mr, ibv_inc_rkey, ibv_mr, ibv_mw,
    ibv_mw_bind_info, ibv_mw_type, ibv_qp_ex, ibv_reg_mr, ibv_send_flags, ibv_sge, ibv_wr_bind_mw,
    ibv_wr_complete, ibv_wr_rdma_read, ibv_wr_rdma_write, ibv_wr_rdma_write_imm, ibv_wr_send,
    ibv_wr_set_inline_data, ibv_wr_set_sge_list, ibv_wr_start,
};
use sideway::ibverbs::protection_domain::ProtectionDomain;

use crate::exposure::Access;

/// The remote right an exposure for `access` gives.
fn remote_right(access: Access) -> ibv_access_flags {
    match access {
        Access::Write => ibv_access_flags::IBV_ACCESS_REMOTE_WRITE,
        Access::Read => ibv_access_flags::IBV_ACCESS_REMOTE_READ,
    }
}

/// A type 2 memory window of the provider's protection domain, deallocated when dropped.
pub(crate) struct MemoryWindow {
    window: NonNull<ibv_mw>,
    /// The key of its last bind (the key of its allocation before any). The extended
    /// bind does not update the handle's key, so it is kept here.
    key: u32,
    /// Cleared once deallocated.
    allocated: bool,
    _domain: Arc<ProtectionDomain>,
}

// SAFETY: a window is a handle the device owns; libibverbs calls on it may come from any
// thread, and this type makes them only through `&mut self` or at drop.
unsafe impl Send for MemoryWindow {}

impl MemoryWindow {
    /// Allocates a type 2 window in `domain` (`ibv_alloc_mw`), bound to nothing.
    pub(crate) fn allocate(domain: &Arc<ProtectionDomain>) -> io::Result<MemoryWindow> {
        // SAFETY: the domain is alive (`domain` holds it) and stays so while the window
        // lives (the window holds it too).
        let window = unsafe { ibv_alloc_mw(domain.pd().as_ptr(), ibv_mw_type::IBV_MW_TYPE_2) };
        let window = NonNull::new(window).ok_or_else(io::Error::last_os_error)?;
        // SAFETY: just allocated.
        let key = unsafe { window.as_ref().rkey };
        Ok(MemoryWindow {
            window,
            key,
            allocated: true,
            _domain: Arc::clone(domain),
        })
    }

    /// The key the window takes at its next bind: its current key with a new low byte
    /// (`ibv_inc_rkey`), as type 2 binds require.
    pub(crate) fn next_key(&self) -> u32 {
        // SAFETY: a pure function of its argument.
        unsafe { ibv_inc_rkey(self.key) }
    }

    /// Records that a bind under `key` completed.
    pub(crate) fn bound(&mut self, key: u32) {
        self.key = key;
    }

    /// The key a peer names the window by.
    pub(crate) fn key(&self) -> u32 {
        self.key
    }

    /// Deallocates the window, which unbinds it: when this returns `Ok`, the device
    /// refuses its key and no access through it is touching memory.
    pub(crate) fn deallocate(&mut self) -> io::Result<()> {
        if !self.allocated {
            return Ok(());
        }
        // SAFETY: the window is allocated and nothing else deallocates it (module
        // invariants); its domain is alive.
        match unsafe { ibv_dealloc_mw(self.window.as_ptr()) } {
            0 => {
                self.allocated = false;
                Ok(())
            }
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

impl Drop for MemoryWindow {
    fn drop(&mut self) {
        if let Err(error) = self.deallocate() {
            tracing::error!(%error, "deallocating a memory window (ibv_dealloc_mw) failed");
        }
    }
}

/// What a range is registered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Purpose {
    /// For a window to be bound over it: local write (which a window granting remote write
    /// needs of its registration) and the right to bind windows, no remote right.
    Window,
    /// For the peer's access itself, under the registration's own key.
    Remote(Access),
}

/// A registration of one exposed range, deregistered when dropped.
pub(crate) struct RangeRegistration {
    registration: NonNull<ibv_mr>,
    /// Cleared once deregistered.
    registered: bool,
    _domain: Arc<ProtectionDomain>,
}

// SAFETY: as for `MemoryWindow`: a device handle, used through `&mut self` or at drop.
unsafe impl Send for RangeRegistration {}

impl RangeRegistration {
    /// Registers `len` bytes at `addr` in `domain` (`ibv_reg_mr`) for `purpose`.
    ///
    /// # Safety
    ///
    /// The bytes are mapped, and stay mapped until the registration is undone: the caller
    /// holds the region they lie in that long.
    pub(crate) unsafe fn register(
        domain: &Arc<ProtectionDomain>,
        addr: u64,
        len: u32,
        purpose: Purpose,
    ) -> io::Result<RangeRegistration> {
        let local_write = ibv_access_flags::IBV_ACCESS_LOCAL_WRITE;
        // A remote write needs the local write right as well (`ibv_reg_mr(3)`).
        let rights = match purpose {
            Purpose::Window => local_write | ibv_access_flags::IBV_ACCESS_MW_BIND,
            Purpose::Remote(Access::Write) => local_write | remote_right(Access::Write),
            Purpose::Remote(Access::Read) => remote_right(Access::Read),
        };
        // SAFETY: the caller keeps the bytes mapped while the registration lives; the
        // domain is alive (`domain` holds it).
        let registration = unsafe {
            ibv_reg_mr(
                domain.pd().as_ptr(),
                addr as *mut _,
                len as usize,
                rights.0 as i32,
            )
        };
        let registration = NonNull::new(registration).ok_or_else(io::Error::last_os_error)?;
        Ok(RangeRegistration {
            registration,
            registered: true,
            _domain: Arc::clone(domain),
        })
    }

    /// The key a peer names the range by, for a registration for [`Purpose::Remote`].
    pub(crate) fn key(&self) -> u32 {
        // SAFETY: the registration was made and is only read here.
        unsafe { self.registration.as_ref().rkey }
    }

    /// Deregisters the range: when this returns `Ok`, the device refuses its key and no
    /// access through it is touching memory.
    pub(crate) fn deregister(&mut self) -> io::Result<()> {
        if !self.registered {
            return Ok(());
        }
        // SAFETY: the registration is live and nothing else deregisters it (module
        // invariants).
        match unsafe { ibv_dereg_mr(self.registration.as_ptr()) } {
            0 => {
                self.registered = false;
                Ok(())
            }
            errno => Err(io::Error::from_raw_os_error(errno)),
        }
    }
}

impl Drop for RangeRegistration {
    fn drop(&mut self) {
        if let Err(error) = self.deregister() {
            tracing::error!(%error, "deregistering an exposed range (ibv_dereg_mr) failed");
        }
    }
}

/// What a send-queue work request does.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SendWork {
    /// A send (`IBV_WR_SEND`).
    Send,
    /// An RDMA WRITE of the data to `addr` under `key`, with an immediate (in host order)
    /// if given (`IBV_WR_RDMA_WRITE`, `IBV_WR_RDMA_WRITE_WITH_IMM`).
    Write {
        key: u32,
        addr: u64,
        imm: Option<u32>,
    },
    /// An RDMA READ from `addr` under `key` into the data's buffers (`IBV_WR_RDMA_READ`).
    Read { key: u32, addr: u64 },
}

/// Where a send-queue work request's bytes are: registered buffers, or bytes copied into
/// the request as it is posted (one buffer: rxe's list form, `ibv_wr_set_inline_data_list`,
/// posts a length of 0 in rdma-core before 64, Debian 12's 44 among them).
#[derive(Clone, Copy)]
pub(crate) enum Data<'a> {
    Elements(&'a [ibv_sge]),
    Inline(&'a [u8]),
}

/// Posts one signaled work request to the send queue of `queue_pair`; returns the errno
/// of `ibv_wr_complete` (0 when posted).
///
/// # Safety
///
/// `queue_pair` is alive, was created with `ibv_create_qp_ex` for every operation `work`
/// may be, and no other posting to it is in progress. The elements name registered
/// memory that the device may reach (write, for a read) until the request completes or
/// the queue pair is destroyed; inline data is readable for the call (the setter only
/// reads it, whatever its pointer's mutability says), and no longer than the queue
/// pair's `max_inline_data`.
pub(crate) unsafe fn post_send_work(
    queue_pair: NonNull<ibv_qp_ex>,
    wr_id: u64,
    work: SendWork,
    data: Data<'_>,
) -> i32 {
    let qp = queue_pair.as_ptr();
    // SAFETY: the caller's promises: a live extended queue pair with these operations,
    // posted to by this call alone; the builder and setter are called between
    // `ibv_wr_start` and `ibv_wr_complete`, as the interface requires, and the data they
    // name is valid as the caller says.
    unsafe {
        ibv_wr_start(qp);
        (*qp).wr_id = wr_id;
        // Inline data is flagged as such too: soft-RoCE reads the flag, not the setter, to
        // tell inline bytes from elements (without it the send fails, LOC_QP_OP_ERR).
        (*qp).wr_flags = match data {
            Data::Elements(_) => ibv_send_flags::IBV_SEND_SIGNALED.0,
            Data::Inline(_) => {
                (ibv_send_flags::IBV_SEND_SIGNALED | ibv_send_flags::IBV_SEND_INLINE).0
            }
        };
        match work {
            SendWork::Send => ibv_wr_send(qp),
            SendWork::Write {
                key,
                addr,
                imm: None,
            } => ibv_wr_rdma_write(qp, key, addr),
            SendWork::Write {
                key,
                addr,
                imm: Some(imm),
            } => ibv_wr_rdma_write_imm(qp, key, addr, imm.to_be()),
            SendWork::Read { key, addr } => ibv_wr_rdma_read(qp, key, addr),
        }
        match data {
            Data::Elements(elements) => {
                ibv_wr_set_sge_list(qp, elements.len(), elements.as_ptr());
            }
            Data::Inline(bytes) => {
                ibv_wr_set_inline_data(qp, bytes.as_ptr().cast_mut().cast(), bytes.len());
            }
        }
        ibv_wr_complete(qp)
    }
}

/// Posts the bind of `window` over the whole of `range` (registered `len` bytes at
/// `addr`) for `access`, under `key` ([`MemoryWindow::next_key`]), as one signaled work
/// request with id `wr_id` on the send queue of `queue_pair`; returns the errno of
/// `ibv_wr_complete` (0 when posted). The window is then bound to that queue pair: its key
/// works for that queue pair's peer alone.
///
/// # Safety
///
/// As [`post_send_work`], for a queue pair created with the bind operation; `window` is
/// allocated and bound to nothing; `range` is live, registered for [`Purpose::Window`] at
/// `addr` for `len` bytes, and stays registered while the window lives.
pub(crate) unsafe fn post_bind(
    queue_pair: NonNull<ibv_qp_ex>,
    wr_id: u64,
    window: &MemoryWindow,
    key: u32,
    range: (&RangeRegistration, u64, u32),
    access: Access,
) -> i32 {
    let qp = queue_pair.as_ptr();
    let (registration, addr, len) = range;
    // SAFETY: as for `post_send_work`; the registration handle is live (the caller's
    // promise), and the bind info is copied by the call.
    unsafe {
        let bind = ibv_mw_bind_info {
            mr: registration.registration.as_ptr(),
            addr,
            length: u64::from(len),
            mw_access_flags: remote_right(access).0,
        };
        ibv_wr_start(qp);
        (*qp).wr_id = wr_id;
        (*qp).wr_flags = ibv_send_flags::IBV_SEND_SIGNALED.0;
        ibv_wr_bind_mw(qp, window.window.as_ptr(), key, &bind);
        ibv_wr_complete(qp)
    }
}
