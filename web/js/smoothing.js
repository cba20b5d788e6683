/**
 * Smoothing of the charts' noisy lines (the gradient norm and the loss): TensorBoard's
 * debiased exponential moving average, so a user reads the same curve at the same slider
 * value as in TensorBoard. Runs on the main thread, from the chart modules.
 */

/** The slider's largest weight: at 1 the average would never move. */
export const MAX_SMOOTHING = 0.99;

/**
 * The debiased EMA of `values` with weight `w` in [0, 1): each point is
 * last = w * last + (1 - w) * value, divided by 1 - w^n (n: finite points so far), so the
 * line starts at the first value instead of creeping up from 0. A missing value (null)
 * stays missing and a NaN or infinite one is passed through unchanged, without entering
 * the average (TensorBoard's rule); a constant series is returned as it is.
 *
 * @param {(number|null)[]} values in step order
 * @param {number} w the smoothing weight (0: no smoothing)
 * @returns {(number|null)[]} one value per input value
 */
export function ema(values, w) {
  const weight = Math.min(Math.max(Number(w) || 0, 0), MAX_SMOOTHING);
  const first = values.find((v) => v !== null);
  const constant = values.every((v) => v === null || v === first);
  let last = 0;
  let n = 0;
  return values.map((v) => {
    if (v === null) return null;
    if (constant || !Number.isFinite(v)) return v;
    last = last * weight + (1 - weight) * v;
    n += 1;
    return weight > 0 ? last / (1 - weight ** n) : last;
  });
}
