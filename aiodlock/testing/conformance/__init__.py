"""The backend conformance suite: every promise of aiodlock, as pytest tests over one backend.

A backend package (aiodlock's own, or a third party's registered under the entry-point group
``aiodlock.backends``) runs the whole suite with one test module::

    import pytest
    from aiodlock.testing.conformance import *  # noqa: F403 - the suite's tests and fixtures

    @pytest.fixture
    def aiodlock_url() -> str:
        return "consul://127.0.0.1:8500"

One module per lock kind or concern. The fixtures a module provides (``aiodlock_url``;
optional ``aiodlock_options``, ``aiodlock_probe``), those the suite defines, how capabilities
select the tests, and assertion rewriting: docs/testing.md."""

from __future__ import annotations

from ._cancellation import (
    STORM_GIVE_UP as STORM_GIVE_UP,
    STORM_MIN_GRANTS as STORM_MIN_GRANTS,
    STORM_SECONDS as STORM_SECONDS,
    STORM_TASKS as STORM_TASKS,
    test_body_exception_in_the_loss_turn_is_not_a_cancellation,
    test_body_exception_passes_through_unwrapped,
    test_cancel_at_each_await_point_leaves_nothing,
    test_cancellation_storm_makes_progress_and_leaves_nothing,
    test_outside_cancellation_stays_cancelled_and_releases,
)
from ._every_kind import (
    test_every_backend_fences_and_wakes,
    test_exclusion_read_sleep_write,
    test_fencing_tokens_strictly_increase,
    test_names_are_opaque,
    test_release_wakes_waiter_without_waiting_out_the_lease,
    test_run_exclusive_returns_result_and_guards,
    test_timeout,
    test_timeout_zero_tries_once,
    test_try_acquire,
    test_undeclared_kinds_fail_at_construction,
)
from ._fairness import (
    test_cancelled_fair_waiter_does_not_block_the_queue,
    test_fair_lock_hands_over_in_arrival_order,
)
from ._fixtures import (
    Target as Target,
    aiodlock_namespace,
    aiodlock_requirements,
    aiodlock_target,
    locks,
    make,
    other,
)
from ._helpers import (
    test_extend_after_release_is_a_runtime_error,
    test_extend_changes_the_ttl_where_the_backend_can,
    test_extend_of_a_lost_lease_raises_lock_lost,
    test_extend_renews_now,
    test_extend_to_a_shorter_ttl_is_kept_alive_at_it,
    test_extend_when_the_renewal_finds_the_lock_gone,
    test_locked_asks_the_service,
    test_locked_escapes_glob_characters,
    test_remaining_counts_down_and_is_zero_once_over,
    test_statistics_totals_and_per_name,
)
from ._leases import (
    test_acquire_outside_async_with_sets_lost,
    test_closing_a_client_ends_its_waiters_and_holders_alike,
    test_crashed_holder_is_replaced_after_expiry,
    test_lost_lease_is_forgotten_at_once,
    test_max_hold_stops_renewing,
    test_release_is_idempotent_and_lost_release_raises,
    test_watchdog_cancels_body_when_lock_is_broken,
)
from ._mutex import (
    test_acquired_reentrant_lease_is_reentered_by_async_with,
    test_non_reentrant_reentry_is_an_error_not_a_deadlock,
    test_reentrant_lock_excludes_other_tasks_of_same_client,
    test_reentrant_lock_same_task_reenters_without_new_token,
)
from ._needs import (
    KINDS as KINDS,
    AnyLock as AnyLock,
    LockKind as LockKind,
    in_process as in_process,
    requires as requires,
    unmet_needs as unmet_needs,
)
from ._operators import (
    test_break_lock_frees_it_moves_the_token_on_and_cancels_the_holder,
    test_inspect_counts_a_waiter_where_the_backend_can_tell,
    test_inspect_names_each_holders_identity,
    test_inspect_shows_holder_and_token_then_nothing_after_release,
    test_namespaces_name_the_one_in_use,
)
from ._processes import (
    test_paused_holder_never_writes_after_its_lock_was_given_away,
    test_sigstopped_holder_is_replaced_and_cancelled_on_resume,
    test_three_processes_read_sleep_write,
)
from ._read_write import (
    test_lock_families_are_independent,
    test_readers_share_writers_exclude,
    test_writer_release_wakes_every_reader,
)
from ._semaphore import (
    test_semaphore_limit,
    test_semaphore_limit_mismatch_is_refused,
    test_semaphore_permit_of_crashed_holder_comes_back,
    test_statistics_and_repr,
)
from ._timing import LATE_RENEWAL_SLACK as LATE_RENEWAL_SLACK, SLACK_TTL as SLACK_TTL

__all__ = [
    "aiodlock_namespace",
    "aiodlock_requirements",
    "aiodlock_target",
    "locks",
    "make",
    "other",
    "pytest_plugins",
    "test_acquire_outside_async_with_sets_lost",
    "test_acquired_reentrant_lease_is_reentered_by_async_with",
    "test_body_exception_in_the_loss_turn_is_not_a_cancellation",
    "test_body_exception_passes_through_unwrapped",
    "test_break_lock_frees_it_moves_the_token_on_and_cancels_the_holder",
    "test_cancel_at_each_await_point_leaves_nothing",
    "test_cancellation_storm_makes_progress_and_leaves_nothing",
    "test_cancelled_fair_waiter_does_not_block_the_queue",
    "test_closing_a_client_ends_its_waiters_and_holders_alike",
    "test_crashed_holder_is_replaced_after_expiry",
    "test_every_backend_fences_and_wakes",
    "test_exclusion_read_sleep_write",
    "test_extend_after_release_is_a_runtime_error",
    "test_extend_changes_the_ttl_where_the_backend_can",
    "test_extend_of_a_lost_lease_raises_lock_lost",
    "test_extend_renews_now",
    "test_extend_to_a_shorter_ttl_is_kept_alive_at_it",
    "test_extend_when_the_renewal_finds_the_lock_gone",
    "test_fair_lock_hands_over_in_arrival_order",
    "test_fencing_tokens_strictly_increase",
    "test_inspect_counts_a_waiter_where_the_backend_can_tell",
    "test_inspect_names_each_holders_identity",
    "test_inspect_shows_holder_and_token_then_nothing_after_release",
    "test_lock_families_are_independent",
    "test_locked_asks_the_service",
    "test_locked_escapes_glob_characters",
    "test_lost_lease_is_forgotten_at_once",
    "test_max_hold_stops_renewing",
    "test_names_are_opaque",
    "test_namespaces_name_the_one_in_use",
    "test_non_reentrant_reentry_is_an_error_not_a_deadlock",
    "test_outside_cancellation_stays_cancelled_and_releases",
    "test_paused_holder_never_writes_after_its_lock_was_given_away",
    "test_readers_share_writers_exclude",
    "test_reentrant_lock_excludes_other_tasks_of_same_client",
    "test_reentrant_lock_same_task_reenters_without_new_token",
    "test_release_is_idempotent_and_lost_release_raises",
    "test_release_wakes_waiter_without_waiting_out_the_lease",
    "test_remaining_counts_down_and_is_zero_once_over",
    "test_run_exclusive_returns_result_and_guards",
    "test_semaphore_limit",
    "test_semaphore_limit_mismatch_is_refused",
    "test_semaphore_permit_of_crashed_holder_comes_back",
    "test_sigstopped_holder_is_replaced_and_cancelled_on_resume",
    "test_statistics_and_repr",
    "test_statistics_totals_and_per_name",
    "test_three_processes_read_sleep_write",
    "test_timeout",
    "test_timeout_zero_tries_once",
    "test_try_acquire",
    "test_undeclared_kinds_fail_at_construction",
    "test_watchdog_cancels_body_when_lock_is_broken",
    "test_writer_release_wakes_every_reader",
]

# The optional fixtures' defaults, as plugin fixtures (see that module): brought into the test
# module by ``import *``, they can be overridden there or in any conftest.py.
pytest_plugins = ["aiodlock.testing._defaults"]
