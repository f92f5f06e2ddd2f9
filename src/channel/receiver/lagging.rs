//! A receive as the caller sees it: the wait (`take_until`), then the backend's part
//! (`deliver`); on a lagging broadcast channel, the messages a receiver missed told as one
//! [`RecvTimeoutError::Lagged`], the message found after them kept for the next receive.

use super::{Receiver, Taken};
use crate::channel::backend::Backend;
use crate::channel::error::RecvTimeoutError;
use crate::channel::message::Message;
use crate::wait::Deadline;

impl<B: Backend> Receiver<B> {
    /// The next message, waiting until `deadline` (see `take_until`). On a lagging channel
    /// every message missed in a row (the ring's jumps, and slots the sender retired before
    /// this receiver held them: `PoolCore::hold_retirable`) is counted without waiting, and
    /// told once, as `Lagged(missed)`; what came after them (a message, or an error) is
    /// what the next receive returns.
    #[inline]
    pub(super) fn recv_until(&self, deadline: Deadline) -> Result<Message<B>, RecvTimeoutError<B>> {
        // (Only lagging channels keep one: the others move no `Option` on their hot path.)
        if let Some(next) = self.lagging.then(|| self.pending.take()).flatten() {
            return self.deliver(next?);
        }
        let mut missed = match self.take_until(deadline) {
            Err(RecvTimeoutError::Lagged(missed)) => missed,
            taken => return self.deliver(taken?),
        };
        loop {
            match self.take_until(Deadline::Now) {
                Err(RecvTimeoutError::Lagged(more)) => missed = missed.saturating_add(more),
                // Nothing more now: the lag is all there is to tell.
                Err(RecvTimeoutError::Timeout) => break,
                next => {
                    self.pending.set(Some(next));
                    break;
                }
            }
        }
        Err(RecvTimeoutError::Lagged(missed))
    }

    /// The backend's part of a receive (a GPU receiver's stream waits for the sender's
    /// writes), then the message. On an error the hold goes, and the slot back unread.
    #[inline(always)]
    fn deliver(&self, t: Taken<B>) -> Result<Message<B>, RecvTimeoutError<B>> {
        let policy = self.wait_policy();
        let view = B::deliver(&self.receiving, &t.imported, &t.hold, &t.desc, policy)?;
        Ok(Message::new(t.hold, t.desc, t.meta, view, t.redelivered))
    }
}
