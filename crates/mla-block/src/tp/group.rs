//! A tensor-parallel group: one queue and one communicator per rank.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicBool, Ordering};

use vt_core::comm::{self, Communicator};
use vt_core::{registry, Device, DeviceType, Error, Queue, Result};

const OP: &str = "TpGroup";

/// Which communicator a group uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    /// NCCL on CUDA, the host communicator on the CPU.
    Auto,
    /// The host communicator (vt-cpu's, registered for every device type by
    /// `vt_backends::init`): any number of ranks, also several on one device (emulation).
    Host,
    /// NCCL (CUDA only, registered by vt-cuda): one rank per device.
    Nccl,
}

impl Transport {
    /// The name its communicator is registered under in `vt_core::comm` (`"auto"` for
    /// [`Transport::Auto`], which [`TpGroup::open`] resolves per device type).
    pub fn name(self) -> &'static str {
        match self {
            Transport::Auto => "auto",
            Transport::Host => "host",
            Transport::Nccl => "nccl",
        }
    }
}

impl FromStr for Transport {
    type Err = Error;
    fn from_str(s: &str) -> Result<Transport> {
        match s {
            "auto" => Ok(Transport::Auto),
            "host" => Ok(Transport::Host),
            "nccl" => Ok(Transport::Nccl),
            _ => Err(Error::invalid(OP, "transport", format!("`{s}` is not one of auto, host, nccl"))),
        }
    }
}

impl fmt::Display for Transport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `tp` ranks: rank `r` issues its work on `queues()[r]` and reduces through `comm(r)`.
pub struct TpGroup {
    queues: Vec<Queue>,
    comms: Vec<Box<dyn Communicator>>,
    /// Decode context parallelism: ranks `g*dcp .. (g+1)*dcp` form DCP group g; rank r
    /// exchanges its partial decode attention through `dcp_comms[r]` (empty when dcp = 1).
    dcp: usize,
    dcp_comms: Vec<Box<dyn Communicator>>,
    /// Set when a failed run aborted the communicators (see [`TpGroup::is_aborted`]).
    aborted: AtomicBool,
}

impl fmt::Debug for TpGroup {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.describe())
    }
}

/// Devices of `kind` the registered backend drives (0 when it is not registered).
pub fn device_count(kind: DeviceType) -> usize {
    registry::backend(kind).map_or(0, |b| b.device_count())
}

impl TpGroup {
    /// A group from its parts: `comms[r].rank() == r`, one world size, one queue per rank.
    pub fn new(queues: Vec<Queue>, comms: Vec<Box<dyn Communicator>>) -> Result<TpGroup> {
        if queues.is_empty() || queues.len() != comms.len() {
            return Err(Error::invalid(
                OP,
                "comms",
                format!(
                    "{} queues and {} communicators (need one of each per rank, >= 1)",
                    queues.len(),
                    comms.len()
                ),
            ));
        }
        for (r, c) in comms.iter().enumerate() {
            if c.rank() != r || c.world_size() != comms.len() {
                return Err(Error::invalid(
                    OP,
                    "comms",
                    format!(
                        "communicator {r} is rank {} of {}, expected rank {r} of {}",
                        c.rank(),
                        c.world_size(),
                        comms.len()
                    ),
                ));
            }
        }
        Ok(TpGroup { queues, comms, dcp: 1, dcp_comms: Vec::new(), aborted: AtomicBool::new(false) })
    }

    /// [`TpGroup::open`] with decode context parallelism: the `tp` ranks form `tp / dcp`
    /// DCP groups of `dcp` consecutive ranks (as vLLM carves its DCP groups out of the TP
    /// group), each with its own communicator of the same transport. `dcp` must divide `tp`.
    pub fn open_with_dcp(kind: DeviceType, tp: usize, dcp: usize, transport: Transport) -> Result<TpGroup> {
        if dcp == 0 || !tp.is_multiple_of(dcp) {
            return Err(Error::invalid(OP, "dcp", format!("{dcp} must be >= 1 and divide tp = {tp}")));
        }
        let mut g = TpGroup::open(kind, tp, transport)?;
        if dcp == 1 {
            return Ok(g);
        }
        let name = g.comms[0].transport();
        let backend = comm::backend(kind, name).ok_or_else(|| {
            Error::invalid(OP, "transport", format!("no `{name}` communicator is registered for {kind}"))
        })?;
        let mut dcp_comms = Vec::with_capacity(tp);
        for sub in g.queues.chunks(dcp) {
            dcp_comms.extend(backend.group(sub)?);
        }
        g.dcp = dcp;
        g.dcp_comms = dcp_comms;
        Ok(g)
    }

    /// Whether a failed run aborted this group: one rank's error aborts every communicator
    /// (TP and DCP) so that no peer waits for it, and an aborted communicator cannot be used
    /// again (NCCL's cannot be revived), so later runs on the group fail at once with an error
    /// saying so. Open a new group to go on.
    pub fn is_aborted(&self) -> bool {
        self.aborted.load(Ordering::SeqCst)
    }

    /// Aborts every communicator of the group, TP and DCP: their pending and later
    /// collectives fail instead of waiting.
    pub(super) fn abort(&self) {
        self.aborted.store(true, Ordering::SeqCst);
        self.comms.iter().chain(&self.dcp_comms).for_each(|c| c.abort());
    }

    /// Ranks of one DCP group (1: no decode context parallelism).
    pub fn dcp(&self) -> usize {
        self.dcp
    }

    /// Rank `r`'s DCP communicator (`None` when dcp = 1).
    pub fn dcp_comm(&self, r: usize) -> Option<&dyn Communicator> {
        self.dcp_comms.get(r).map(|c| c.as_ref())
    }

    /// `tp` ranks on devices of `kind`, reducing through `transport`, the communicator
    /// the device type's backend registered under that name (`vt_core::comm`).
    ///
    /// - NCCL (the default on CUDA) needs `tp` devices, one per rank: fewer is an error
    ///   naming how many were found.
    /// - The host transport (the default on the CPU, where all ranks share the one host
    ///   device) puts rank `r` on device `r % devices`, so several ranks may share a GPU.
    pub fn open(kind: DeviceType, tp: usize, transport: Transport) -> Result<TpGroup> {
        if tp == 0 {
            return Err(Error::invalid(OP, "tp", "must be >= 1"));
        }
        let found = device_count(kind);
        let transport = match (transport, kind) {
            (Transport::Auto, DeviceType::Cuda) => Transport::Nccl,
            (Transport::Auto, DeviceType::Cpu) => Transport::Host,
            (Transport::Auto, k) => {
                return Err(Error::invalid(
                    OP,
                    "transport",
                    format!("no communicator for {k} devices (RCCL is not wired); `host` emulates ranks"),
                ))
            }
            (t, _) => t,
        };
        if found == 0 {
            return Err(Error::NoDevice {
                device: kind.to_string(),
                msg: format!("tp = {tp} needs {kind} devices, found 0 (no {kind} backend registered)"),
            });
        }
        if transport == Transport::Nccl && kind != DeviceType::Cuda {
            return Err(Error::invalid(OP, "transport", format!("NCCL runs on CUDA devices, not {kind}")));
        }
        let comm = comm::backend(kind, transport.name()).ok_or_else(|| {
            let have = comm::transports(kind);
            Error::invalid(
                OP,
                "transport",
                format!(
                    "no `{transport}` communicator is registered for {kind} devices (registered: {})",
                    if have.is_empty() { "none".to_string() } else { have.join(", ") }
                ),
            )
        })?;
        let shared = comm.ranks_may_share_a_device();
        if !shared && found < tp {
            return Err(Error::NoDevice {
                device: kind.to_string(),
                msg: format!(
                    "tp = {tp} needs {tp} {kind} devices (one rank per device over {transport}), found {found}"
                ),
            });
        }
        let queues = (0..tp).map(|r| Queue::new(Device::new(kind, r % found))).collect::<Result<Vec<_>>>()?;
        let comms = comm.group(&queues)?;
        TpGroup::new(queues, comms)
    }

    /// Ranks in the group.
    pub fn tp(&self) -> usize {
        self.queues.len()
    }

    /// Rank `r`'s queue is `queues()[r]`.
    pub fn queues(&self) -> &[Queue] {
        &self.queues
    }

    /// Rank `r`'s communicator.
    pub fn comm(&self, r: usize) -> Option<&dyn Communicator> {
        self.comms.get(r).map(|c| c.as_ref())
    }

    /// `"2 ranks on cuda:0, cuda:1 over nccl"`, `"4 ranks sharing cpu:0 over host"`.
    pub fn describe(&self) -> String {
        let mut devs: Vec<String> = self.queues.iter().map(|q| q.device().to_string()).collect();
        let n = devs.len();
        devs.dedup();
        let place = match (n, devs.len()) {
            (1, _) => format!("1 rank on {}", devs[0]),
            (_, 1) => format!("{n} ranks sharing {}", devs[0]),
            _ => format!("{n} ranks on {}", devs.join(", ")),
        };
        let dcp = if self.dcp > 1 { format!(", dcp = {}", self.dcp) } else { String::new() };
        format!("{place} over {}{dcp}", self.comms[0].transport())
    }
}
