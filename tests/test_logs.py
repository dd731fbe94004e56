"""TILESCALE_LOG and tilelang's lines under tilescale (tilescale/logs.py): levels applied when tilescale builds or
starts, tilelang's warnings once per process, its per-kernel INFO lines hidden by default, rank prefixes."""
import logging

import pytest

from tilescale import logs


class Records(logging.Handler):
    def __init__(self):
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(self.format(record))


@pytest.fixture
def tl_log(menv):
    """tilelang's logger with a recording handler (as tilelang's own handler, it gets tilescale's filter), and
    the logging state of both loggers restored after."""
    tl, ours = logging.getLogger("tilelang"), logging.getLogger("tilescale")
    saved = (tl.level, ours.level, set(logs._FILTER.seen), logs._FILTER.level, logs._tilelang_level_set)
    h = Records()
    tl.addHandler(h)
    tl.setLevel(logs.TILELANG_DEFAULT_LEVEL)
    logs._FILTER.seen.clear()
    yield h
    tl.removeHandler(h)
    tl.setLevel(saved[0])
    ours.setLevel(saved[1])
    logs._FILTER.seen.clear()
    logs._FILTER.seen.update(saved[2])
    logs._FILTER.level, logs._tilelang_level_set = saved[3], saved[4]


def test_tilescale_log_sets_both_loggers_when_applied(tl_log, menv):
    logs.apply()
    assert logging.getLogger("tilescale").level == logging.WARNING
    assert logging.getLogger("tilelang").level == logging.WARNING   # tilelang's INFO per kernel: hidden
    menv.setenv("TILESCALE_LOG", "debug")
    assert logging.getLogger("tilescale").level == logging.WARNING   # read when applied, not before
    logs.apply()
    assert logging.getLogger("tilescale").level == logging.DEBUG
    assert logging.getLogger("tilelang").level == logging.DEBUG


def test_tilelang_info_lines_only_at_info(tl_log, menv):
    cache_log = logging.getLogger("tilelang.cache.kernel_cache")
    saved = cache_log.level
    cache_log.setLevel(logging.DEBUG)              # as tilelang's KernelCache sets its own logger
    try:
        logs.apply()
        logging.getLogger("tilelang.jit.kernel").info("TileLang begins to compile kernel `k`")
        cache_log.info("Generated cache key: abc for kernel k")
        assert tl_log.lines == []
        menv.setenv("TILESCALE_LOG", "info")
        logs.apply()
        cache_log.info("Generated cache key: abc for kernel k")
        assert tl_log.lines == ["Generated cache key: abc for kernel k"]
    finally:
        cache_log.setLevel(saved)


def test_tilelang_warnings_once_per_process(tl_log):
    logs.apply()
    cache_log = logging.getLogger("tilelang.cache.kernel_cache")
    for name in ("ag_gemm", "ag_gemm", "gemm_rs"):     # one per kernel and call, as tilelang logs it
        cache_log.warning("Found kernel '%s' in memory cache. For better performance, consider using "
                          "`@tilelang.jit` instead of direct kernel caching.", name)
    for i in (1, 2):
        cache_log.warning(f"Disk cache entry at /tmp/c{i} failed integrity verification")
    cache_log.warning("another warning")
    assert len(tl_log.lines) == 3, tl_log.lines
    assert "'ag_gemm'" in tl_log.lines[0] and "/tmp/c1" in tl_log.lines[1]
    second = Records()                                  # a record is shown at every handler, or at none
    logging.getLogger("tilelang").addHandler(second)
    try:
        logs.apply()
        cache_log.warning("a new warning")
        cache_log.warning("a new warning")
    finally:
        logging.getLogger("tilelang").removeHandler(second)
    assert tl_log.lines[3:] == second.lines == ["a new warning"]
    cache_log.error("an error is never dropped")
    cache_log.error("an error is never dropped")
    assert len(tl_log.lines) == 6


def test_lines_carry_the_rank_in_a_job_of_several_ranks(tl_log, menv):
    logs.apply()
    menv.setenv("WORLD_SIZE", "4")
    menv.setenv("RANK", "2")
    logging.getLogger("tilelang").warning("from tilelang")
    assert tl_log.lines == ["[rank 2] from tilelang"]
    assert logs.RankFormatter("%(message)s").format(
        logging.LogRecord("tilescale", logging.WARNING, __file__, 1, "from tilescale", (), None)) == \
        "[rank 2] from tilescale"
    assert not logs.is_rank0()
    menv.setenv("WORLD_SIZE", "1")
    assert logs.rank_prefix() == "" and logs.is_rank0()


def test_records_of_others_at_a_handler_shared_with_tilelang_pass_unchanged(tl_log, menv):
    """A handler on tilelang's logger may also be the root's (pytest attaches its capture to every logger that does
    not propagate): the filter leaves every other logger's records alone."""
    logs.apply()
    menv.setenv("WORLD_SIZE", "2")
    menv.setenv("RANK", "1")
    mine = logging.getLogger("myapp")
    saved = mine.level, mine.propagate
    mine.setLevel(logging.DEBUG)
    mine.propagate = False
    mine.addHandler(tl_log)                             # the handler now on both loggers
    try:
        mine.debug("debug of %s", "myapp")
        mine.warning("twice")
        mine.warning("twice")
    finally:
        mine.removeHandler(tl_log)
        mine.setLevel(saved[0])
        mine.propagate = saved[1]
    assert tl_log.lines == ["debug of myapp", "twice", "twice"]


def test_a_tilelang_level_set_by_the_user_is_kept(tl_log):
    logging.getLogger("tilelang").setLevel(logging.ERROR)     # tilelang.set_log_level("ERROR")
    logs.apply()
    assert logging.getLogger("tilelang").level == logging.ERROR


def test_tilescale_applies_the_log_settings_where_it_builds_and_starts(menv):
    """compile, build, batches and init_distributed apply TILESCALE_LOG before anything else."""
    import tilescale
    from tilescale import batch, build_only, kernel_build, runtime

    class Applied(Exception):
        pass

    def apply():
        raise Applied

    menv.setattr(logs, "apply", apply)
    for call in (lambda: kernel_build.compile_kernel(None), lambda: build_only.build(None),
                 lambda: batch.run([lambda: None], None), lambda: runtime.init_distributed(),
                 lambda: tilescale.build_all([lambda: None])):
        with pytest.raises(Applied):
            call()
