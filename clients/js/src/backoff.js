// When to try again: full-jitter exponential backoff that never comes back before the
// gateway's retry hint. The same policy, with the same defaults, as the Rust crate's
// idlegate_client::Backoff.

/** First window: a lone client is back within a second, and a fleet cut off at once spreads over it. */
export const DEFAULT_BASE_MS = 1000;
/** Largest window: a client of a gateway that stays down tries about twice a minute. */
export const DEFAULT_CAP_MS = 30_000;

export class Backoff {
  constructor({ baseMs = DEFAULT_BASE_MS, capMs = DEFAULT_CAP_MS } = {}) {
    if (!(baseMs >= 0 && capMs >= 0)) throw new RangeError('backoff base and cap must be non-negative');
    this.baseMs = baseMs;
    this.capMs = capMs;
  }

  /** The window of attempt `attempt` (0 for the first after a loss): min(cap, base * 2^attempt). */
  windowMs(attempt) {
    return Math.min(this.capMs, this.baseMs * 2 ** Math.min(attempt, 52));
  }

  /**
   * The wait before attempt `attempt`: a uniform draw over its window, and at least the
   * gateway's hint when it gave one. `random` is for tests.
   */
  delayMs(attempt, hintMs, random = Math.random) {
    const jittered = Math.floor(this.windowMs(attempt) * random());
    return hintMs === undefined ? jittered : Math.max(jittered, hintMs);
  }
}
