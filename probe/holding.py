"""Whether each optimizer's parameters ever hold a gradient at its steps (``idle_optimizer``).

Thread: training (the tracker calls :meth:`Holdings.stepped` after each step's facts).

An optimizer is checked at its steps 0, 1, 2, 4, 8, ... until every parameter that requires
grad has held a gradient at one of them; then never again (a usual run is done at its second
step). It *held* a gradient once a parameter did, or once a step's facts show contributions,
consumed or thrown away by a reset (a ``zero_grad`` between backward and step leaves nothing
to see at the step itself). What is missing is sent as a :class:`~gradwatch.wire.Holding`
record from the second step on, and again when it changes (at most once per check).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from gradwatch.probe.facts import StepFacts, TextbookStep
from gradwatch.probe.ledger import Ledger
from gradwatch.wire import Holding


class _State:
    __slots__ = ("led", "held", "ever", "sent")

    def __init__(self, led: Ledger) -> None:
        self.led = led
        self.held = False
        self.ever: set[int] = set()
        """Parameters seen holding a gradient at a step."""
        self.sent: tuple[bool, list[int]] | None = None


class Holdings:
    """The optimizers still checked (keyed by name, as step facts name them)."""

    __slots__ = ("pending", "emit")

    def __init__(self, emit: Callable[[Holding], None]) -> None:
        self.pending: dict[str, _State] = {}
        """Optimizers not yet seen with every parameter holding a gradient."""
        self.emit = emit

    def watch(self, led: Ledger) -> None:
        """Check ``led``'s optimizer from its next step on."""
        self.pending[led.name] = _State(led)

    def stepped(self, facts: StepFacts) -> None:
        """The step ``facts`` was handed over: check its optimizer when due."""
        st = self.pending.get(facts.opt)
        if st is None:
            return
        step = facts.step
        if step & (step - 1):  # checked at steps 0, 1, 2, 4, 8, ...
            return
        params = st.led.params
        requiring = [k for k, p in enumerate(params) if p.requires_grad]
        st.ever.update(k for k in requiring if params[k].grad is not None)
        if not st.held:
            st.held = bool(st.ever) or _contributions(facts)
        never = [k for k in requiring if k not in st.ever]
        if step >= 1:
            state = (st.held, never)
            notable = bool(never) or (bool(requiring) and not st.held)
            if state != st.sent and (notable or st.sent is not None):
                st.sent = state
                self.emit(Holding(seq=0, t=time.time(), opt=facts.opt, step=step,
                                  requiring=len(requiring), held=st.held, never=never))
            if st.held and not never:
                del self.pending[facts.opt]


def _contributions(facts: StepFacts) -> bool:
    """Whether a step's facts show a gradient contribution, consumed or reset away."""
    if isinstance(facts, TextbookStep):
        return len(facts.hits) > 1
    return bool(facts.tally.consumed or facts.late or facts.losses
                or any(r.removed for r in facts.resets))
