/**
 * The step player of a stored run: a slider over the run's steps with Play/Pause (of the
 * playback; the toolbar's "Freeze chart" is what stops a live chart) and speed. The chosen step is drawn as a cursor across the charts and read out below them.
 * At 1× the whole run plays in about a minute, whatever its length.
 */

const FULL_RUN_SECONDS = 60;

export class Player {
  /**
   * @param {{root, play, speed, slider, readout}} els
   * @param {(step: number) => void} onStep
   */
  constructor(els, onStep) {
    Object.assign(this, els);
    this.onStep = onStep;
    this.playing = false;
    this.raf = 0;
    this.last = 0;
    this.pos = 0;
    this.slider.addEventListener("input", () => {
      this.pos = Number(this.slider.value);
      this.onStep(this.pos);
    });
    this.play.addEventListener("click", () => this.toggle());
  }

  /**
   * Enable the player over steps [min, max] (a stored run), or disable it (a live run).
   * It stays in place either way, so the page does not jump when a run ends.
   */
  setup(enabled, min = 0, max = 0) {
    this.root.hidden = false;
    for (const c of [this.play, this.speed, this.slider]) c.disabled = !enabled;
    this.root.classList.toggle("off", !enabled);
    if (!enabled) {
      this.stop();
      this.readout.textContent = "step player: opens when the run ends";
      return;
    }
    const fresh = Number(this.slider.max) !== max || Number(this.slider.min) !== min;
    this.slider.min = String(min);
    this.slider.max = String(max);
    if (fresh) {
      this.pos = min;
      this.slider.value = String(min);
    }
  }

  /**
   * Enable the player over the steps of `series` (and of the zoom `range`) for a stored
   * run; disable it for a live one. Returns true when enabled.
   */
  setupFor(series, live, range) {
    let min = Infinity, max = -Infinity;
    for (const s of series.values()) {
      if (s.length) {
        min = Math.min(min, s.step[0]);
        max = Math.max(max, s.lastStep);
      }
    }
    if (live || !(min <= max)) {
      this.setup(false);
      return false;
    }
    if (range) {
      min = Math.min(min, Math.floor(range[0]));
      max = Math.max(max, Math.ceil(range[1]));
    }
    this.setup(true, Math.max(0, min), max);
    return true;
  }

  toggle() {
    if (this.playing) this.stop();
    else this.start();
  }

  start() {
    const min = Number(this.slider.min), max = Number(this.slider.max);
    if (this.pos >= max) this.pos = min;
    this.playing = true;
    this.play.setAttribute("aria-pressed", "true");
    this.play.textContent = "Pause";
    this.last = performance.now();
    const tick = (now) => {
      if (!this.playing) return;
      const dt = (now - this.last) / 1000;
      this.last = now;
      const span = Math.max(1, max - min);
      const speed = Number(this.speed.value) || 1;
      this.pos = Math.min(max, this.pos + Math.max(dt * speed * span / FULL_RUN_SECONDS, dt * speed * 10));
      this.slider.value = String(Math.round(this.pos));
      this.onStep(Math.round(this.pos));
      if (this.pos >= max) this.stop();
      else this.raf = requestAnimationFrame(tick);
    };
    this.raf = requestAnimationFrame(tick);
  }

  stop() {
    this.playing = false;
    cancelAnimationFrame(this.raf);
    this.play.setAttribute("aria-pressed", "false");
    this.play.textContent = "Play";
  }

  /** Move the slider to a step shown by other means (a clicked finding), not playing it. */
  place(step) {
    this.pos = step;
    this.slider.value = String(step);
  }
}
