//! MPMC runs: the cells ready in a row for one side of the ring, claimed with one
//! compare-and-swap of its position counter (see `mpmc.rs`, "Runs").

use bytemuck::Pod;

use super::repair::REPAIR_SCAN;
use super::{Storage, cell_at};
use crate::layout::{
    Claims, Corrupted, MAX_CLAIM_RUN, MpmcCell, STAMP_ADOPTED, STAMP_FLAGS, STAMP_SKIPPED,
    STAMP_UNUSED,
};
use crate::liveness::ClaimLine;
use crate::sync::{AtomicU64, Ordering, spin_hint};

/// The longest run of cells one push or pop claims with one compare-and-swap (a slice
/// longer than this moves in several runs). No longer than the span one repair looks at,
/// so that one liveness tick repairs the whole run of an endpoint that died holding it.
pub const MAX_RUN: usize = 64;
const _: () = assert!(MAX_RUN as u64 <= REPAIR_SCAN);
const _: () = assert!(MAX_RUN as u64 <= MAX_CLAIM_RUN);

/// Which side of the ring a run is claimed for.
#[derive(Clone, Copy)]
pub(super) enum Turn {
    /// Producers: a cell is ready at `p` when its stamp is `p` (free, no flag).
    Write,
    /// Consumers: a cell is ready at `p` when its stamp is `p + 1` (written or skipped).
    Read,
}

/// A run of cells claimed (or found ready) from `first`: `n` cells; bit `i` of `skipped`
/// set when the cell at `first + i` is stamped skipped (consumers only: its producer died
/// before writing it). `n` ≤ [`MAX_RUN`] = 64, so the mask fits.
#[derive(Clone, Copy)]
pub(super) struct Claimed {
    pub(super) first: u64,
    pub(super) n: u64,
    pub(super) skipped: u64,
}

/// What a look at the cells from a position found.
enum Run {
    /// The first `n` (≥ 1) cells are ready for this side; bit `i` of the mask: the cell at
    /// `pos + i` is stamped skipped.
    Ready(u64, u64),
    /// The first cell is not ready yet: the ring is full (producers) or empty (consumers).
    Wait,
    /// The first cell was already taken by another endpoint: the position counter has moved
    /// on, to this.
    Moved(u64),
}

/// Looks at up to `want` cells from `pos` (which the caller read from its side's position
/// counter) and says how many in a row are ready for `turn`. Each stamp is read with
/// Acquire: pairs with the Release stamp store of the other side (a consumer's free, read
/// by producers, orders its read of the old element before our write; a producer's
/// publish, read by consumers, makes the element visible), or of a repairer or adopter.
#[inline(always)]
fn ready_run<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    counter: &AtomicU64,
    pos: u64,
    want: u64,
    turn: Turn,
) -> Result<Run, Corrupted> {
    // `taken`: the flags of a cell at this side's position that an adopter has taken
    // (consumers): the counter has moved past it. `bad`: flags no cell at this side's
    // position can carry.
    let (offset, taken, bad, flagged, behind, ahead) = match turn {
        Turn::Write => (
            0,
            0,
            STAMP_FLAGS,
            "flagged stamp on a cell free for a producer",
            "cell stamp more than one lap behind tail",
            "cell stamp ahead of tail",
        ),
        Turn::Read => (
            1,
            STAMP_ADOPTED,
            STAMP_UNUSED,
            "adopted stamp on a cell not yet taken",
            "cell stamp more than one lap behind head",
            "cell stamp ahead of head",
        ),
    };
    // Another endpoint of this side won `pos` and already stamped (or reserved) it, so the
    // counter has moved on, unless `what` says the stamp is forged.
    let moved = |what| {
        // Acquire: as the first load in `claim_run`.
        let current = counter.load(Ordering::Acquire);
        if current == pos {
            // The Acquire stamp load saw a store made after the counter passed `pos`, so
            // it cannot still read `pos`: the stamp is forged.
            return Err(Corrupted { what });
        }
        Ok(Run::Moved(current))
    };
    let mut n = 0;
    let mut skipped = 0;
    while n < want {
        let at = pos.wrapping_add(n);
        // Acquire: see above.
        let raw = cell_at(storage, capacity, at).stamp.load(Ordering::Acquire);
        let lag = (raw & !STAMP_FLAGS).wrapping_sub(at.wrapping_add(offset)) as i64;
        if lag == 0 && raw & bad != 0 {
            return Err(Corrupted { what: flagged });
        } else if lag == 0 && raw & taken == 0 {
            skipped |= u64::from(raw & STAMP_SKIPPED != 0) << n;
            n += 1;
        } else if lag < -(capacity as i64) {
            return Err(Corrupted { what: behind });
        } else if n > 0 {
            // The run ends here (not yet ready, or already taken: the CAS will tell).
            break;
        } else if lag == 0 {
            return moved(flagged); // taken by an adopter
        } else if lag < 0 {
            // Producers: the cell still holds the previous lap's element (stamp p - capacity
            // + 1), or that lap's producer has won it and not yet written it (p - capacity).
            // Consumers: not yet written for this lap (stamp p), or the previous lap's
            // consumer has won it and not yet freed it (p - capacity + 1).
            return Ok(Run::Wait);
        } else {
            return moved(ahead);
        }
    }
    Ok(Run::Ready(n, skipped))
}

/// Claims a run of up to `want` (≥ 1) cells ready for `turn` from the side's position
/// counter and returns it; `None` when the first cell is not ready (full / empty). With a
/// claim `line` (whose lock the caller holds until it has finished the run's cells), names
/// the run there before each compare-and-swap.
#[inline(always)]
pub(super) fn claim_run<T: Pod, S: Storage<Cell = MpmcCell<T>>>(
    storage: &S,
    capacity: u64,
    want: u64,
    turn: Turn,
    line: Option<ClaimLine<'_>>,
) -> Result<Option<Claimed>, Corrupted> {
    let control = storage.control();
    let counter = match turn {
        Turn::Write => &control.tail,
        Turn::Read => &control.head,
    };
    // Acquire: pairs with the Release CAS of the endpoint that moved the counter here (a
    // release sequence: every earlier winner's CAS too). So whatever each winner saw of its
    // cells before winning, this endpoint sees as well, and a stamp more than a lap behind
    // the position read here is truly impossible, never a stale view (`ready_run`).
    let mut pos = counter.load(Ordering::Acquire);
    loop {
        let (n, skipped) = match ready_run(storage, capacity, counter, pos, want, turn)? {
            Run::Ready(n, skipped) => (n, skipped),
            Run::Wait => {
                if let Some(line) = line {
                    // Nothing to claim: our word may still name a position we tried for and
                    // lost (or one we finished), and a tentative claim left there would
                    // keep a dead winner's cell at that position from being repaired for as
                    // long as we wait (a stall: we may be waiting for that very cell).
                    // Relaxed: clearing a word that names no cell of ours is never unsafe.
                    let word = match turn {
                        Turn::Write => &line.line.push,
                        Turn::Read => &line.line.pop,
                    };
                    if word.load(Ordering::Relaxed) != 0 {
                        word.store(0, Ordering::Relaxed);
                    }
                }
                return Ok(None);
            }
            Run::Moved(current) => {
                pos = current;
                spin_hint();
                continue;
            }
        };
        if let Some(line) = line {
            let word = match turn {
                Turn::Write => &line.line.push,
                Turn::Read => &line.line.pop,
            };
            // The claim, before the CAS (rewritten on every retry): if this endpoint wins,
            // its line names the run from the moment the counter passes it. Relaxed: the
            // Release CAS below orders it for whoever reads the new position with Acquire
            // (a repairer: `Watch::orphaned`).
            word.store(Claims::word(pos, n), Ordering::Relaxed);
        }
        // Ownership of the cells is handed over by their stamps, not by the counter. A
        // cell of the run cannot change under us before the CAS: only the winner of its
        // position (which moves the counter past it, failing our CAS) or a repair of a cell
        // of an earlier, dead winner (never a ready one) touches it. Release on success,
        // Acquire on failure: pairs with the counter loads above and in `ready_run` (the
        // stamps this endpoint read before winning are visible to whoever reads the new
        // position), and with the repairers' Acquire counter loads (our claim is visible).
        match counter.compare_exchange_weak(
            pos,
            pos.wrapping_add(n),
            Ordering::Release,
            Ordering::Acquire,
        ) {
            Ok(_) => {
                crate::fault::point(match turn {
                    Turn::Write => "push_won",
                    Turn::Read => "pop_won",
                });
                return Ok(Some(Claimed { first: pos, n, skipped }));
            }
            Err(current) => pos = current,
        }
    }
}
