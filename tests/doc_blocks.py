"""Every code block of the README and the operator guide, and the test that runs it.

``blocks`` finds the blocks with the Markdown parser rich already brings (markdown-it-py), fenced
and indented alike, so a block added to a doc without a test fails ``test_doc_blocks``. A test
that runs a block takes its text from the doc with ``block(doc, first_line_prefix)``: what runs
is what the reader copies.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from markdown_it import MarkdownIt

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "docs/operations.md", "docs/architecture.md", "examples/README.md", "docs/etcd.md",
        "docs/security.md", "docs/deploying.md", "docs/configuration.md", "docs/benchmark.md", "docs/development.md",
        "docs/client.md", "docs/postgres.md", "docs/mariadb.md")


@dataclass(frozen=True)
class Block:
    doc: str
    line: int  # 1-based line of the block's first line of code
    text: str

    @property
    def first(self) -> str:
        return self.text.lstrip().splitlines()[0] if self.text.strip() else ""


def blocks(doc: str) -> list[Block]:
    tokens = MarkdownIt("commonmark").parse((ROOT / doc).read_text(encoding="utf-8"))
    found = []
    for tok in tokens:
        if tok.type in ("fence", "code_block") and tok.map:
            line = tok.map[0] + (2 if tok.type == "fence" else 1)
            found.append(Block(doc, line, tok.content))
    return found


def block(doc: str, prefix: str) -> Block:
    """The one block of ``doc`` whose first line starts with ``prefix``."""
    hits = [b for b in blocks(doc) if b.first.startswith(prefix)]
    if len(hits) != 1:
        raise LookupError(f"{len(hits)} blocks of {doc} start with {prefix!r}")
    return hits[0]


# (doc, prefix of the block's first line) -> where it runs: "path::test" for a test that takes the
# block from the doc with ``block(doc, prefix)``, or "shown: why" for a block that is not a command
# (a diagram, lines a command printed).
CLAIMS: dict[tuple[str, str], str] = {
    ("docs/operations.md", "from safepoint.errors import AdmissionRefused"):
        "tests/integration/test_client.py::test_the_guides_report_is_admitted_throttled_and_refused_by_the_band",
    ("README.md", "./scripts/demo.sh"):
        "tests/integration/test_demo.py::test_the_readmes_demo_command_gives_directives_and_ends_soon_after_ctrl_c",
    ("README.md", "./scripts/test.sh"): "tests/unit/test_doc_blocks.py::test_ci_runs_the_readmes_test_command",
    ("docs/development.md", ".venv/bin/python scripts/gen_event_records.py"):
        "tests/unit/test_event_records.py::test_the_developers_page_writes_the_records_and_checks_the_rules",
    ("README.md", "pip install ."): "tests/integration/test_bare_install.py::test_the_bare_package_is_the_node_client",
    ("README.md", "from safepoint.connectors.reporter import Reporter"):
        "tests/integration/test_readme.py::test_the_readme_node_example_runs_and_compacts",
    ("docs/client.md", "reporter, err := safepoint.NewReporter"):
        "tests/integration/test_readme.py::test_the_readmes_go_and_java_nodes_run_and_compact",
    ("docs/client.md", "try (Reporter reporter = Reporter.builder"):
        "tests/integration/test_readme.py::test_the_readmes_go_and_java_nodes_run_and_compact",
    ("README.md", "./scripts/images.sh"):
        "tests/integration/test_compose.py::test_the_deployment_pages_compose_lines_run_the_product",
    ("docs/deploying.md", "./scripts/images.sh"):
        "tests/integration/test_compose.py::test_the_deployment_pages_compose_lines_run_the_product",
    ("docs/deploying.md", "spark-submit --master spark://master:7077"):
        "tests/integration/test_submit.py::test_the_readmes_spark_submit_command",
    ("README.md", ".venv/bin/safepoint bench"): "tests/integration/test_submit.py::test_the_readmes_bench_command",
    ("docs/operations.md", "nodes --(safepoint.events"): "shown: the data flow diagram",
    ("docs/operations.md", "retention = 20000000"):
        "tests/unit/test_policies.py::test_the_guides_clusters_of_several_engines",
    ("docs/operations.md", "safepoint ack-gap c1"):
        "tests/integration/test_gaps_e2e.py::test_a_topic_made_again_is_read_from_its_new_start_and_a_lost_service_hold_"
        "holds_until_acknowledged",
    ("docs/operations.md", "export SPARK_HOME="):
        "tests/integration/test_spark_cluster.py::test_the_job_on_a_standalone_cluster_survives_losing_a_worker",
    ("docs/operations.md", "ERROR TaskSchedulerImpl: Lost executor"): "shown: lines of the job's log",
    ("docs/operations.md", "echo '{\"v\":1,\"type\":\"heartbeat\""):
        "tests/integration/test_kcat.py::test_the_guides_kcat_and_check_node_blocks",
    ("docs/operations.md", "kcat -C -b 127.0.0.1:9092"):
        "tests/integration/test_kcat.py::test_the_guides_kcat_and_check_node_blocks",
    ("docs/operations.md", "safepoint check-node --bootstrap"):
        "tests/integration/test_kcat.py::test_the_guides_kcat_and_check_node_blocks",
    ("docs/architecture.md", "database node"): "shown: the data flow diagram",
    ("docs/architecture.md", "TX = register("):
        "tests/unit/test_hold_kinds.py::test_the_architecture_pages_registration_is_the_codes",
    ("README.md", "from safepoint.connectors.service_hold import ServiceHold"):
        "tests/integration/test_control_e2e.py::test_service_holds_pause_and_ttl_through_the_job",
    ("README.md", ".venv/bin/safepoint replay --config examples/"):
        "tests/unit/test_golden.py::test_the_docs_replay_command_prints_the_worked_example",
    ("examples/README.md", ".venv/bin/safepoint replay --config examples/"):
        "tests/unit/test_golden.py::test_the_docs_replay_command_prints_the_worked_example",
    ("README.md", ".venv/bin/safepoint demo --engine etcd"):
        "tests/integration/test_demo_engines.py::test_the_demo_runs_etcd_postgres_and_mariadb_beside_the_simulated_cluster",
    ("README.md", ".venv/bin/safepoint demo --engine postgres"):
        "tests/integration/test_demo_engines.py::test_the_demo_runs_etcd_postgres_and_mariadb_beside_the_simulated_cluster",
    ("README.md", ".venv/bin/python examples/postgres/run.py"):
        "tests/integration/test_postgres_example.py::test_the_postgres_example_tells_its_story",
    ("README.md", ".venv/bin/python examples/etcd/run.py"):
        "tests/integration/test_etcd_example.py::test_the_etcd_example_tells_its_story_and_the_dashboard_names_the_hold",
    ("docs/etcd.md", ".venv/bin/python examples/etcd/run.py"):
        "tests/integration/test_etcd_example.py::test_the_etcd_example_tells_its_story_and_the_dashboard_names_the_hold",
    ("README.md", ".venv/bin/safepoint demo --engine mariadb"):
        "tests/integration/test_demo_engines.py::test_the_demo_runs_etcd_postgres_and_mariadb_beside_the_simulated_cluster",
    ("README.md", ".venv/bin/python examples/mariadb/run.py"):
        "tests/integration/test_mariadb_example.py::test_the_mariadb_example_tells_its_story",
    ("docs/mariadb.md", "CREATE USER 'safepoint'"):
        "tests/integration/test_mariadb_e2e.py::test_no_directive_passes_a_read_view_until_the_agent_ends_it",
    ("docs/mariadb.md", "[clusters.mdb-main]"):
        "tests/integration/test_mariadb_e2e.py::test_no_directive_passes_a_read_view_until_the_agent_ends_it",
    ("docs/mariadb.md", ".venv/bin/safepoint agent mariadb"):
        "tests/integration/test_mariadb_e2e.py::test_no_directive_passes_a_read_view_until_the_agent_ends_it",
    ("docs/mariadb.md", ".venv/bin/python examples/mariadb/run.py"):
        "tests/integration/test_mariadb_example.py::test_the_mariadb_example_tells_its_story",
    ("docs/postgres.md", "[clusters.pg-main]"):
        "tests/integration/test_postgres_e2e.py::test_no_directive_passes_a_postgres_hold_until_it_ends",
    ("docs/postgres.md", ".venv/bin/safepoint agent postgres"):
        "tests/integration/test_postgres_e2e.py::test_no_directive_passes_a_postgres_hold_until_it_ends",
    ("docs/postgres.md", ".venv/bin/python examples/postgres/run.py"):
        "tests/integration/test_postgres_example.py::test_the_postgres_example_tells_its_story",
    ("docs/etcd.md", "[clusters.etcd-main]"):
        "tests/integration/test_etcd_e2e.py::test_held_revisions_stay_readable_while_compaction_goes_on_through_failures",
    ("docs/etcd.md", ".venv/bin/safepoint agent etcd"):
        "tests/integration/test_etcd_e2e.py::test_held_revisions_stay_readable_while_compaction_goes_on_through_failures",
    ("docs/etcd.md", "from safepoint.connectors.etcd_holds import RevisionHold"):
        "tests/integration/test_etcd_e2e.py::test_held_revisions_stay_readable_while_compaction_goes_on_through_failures",
    ("docs/development.md", "SAFEPOINT_TEST_KAFKA=kafka"):
        "tests/integration/test_broker_choice.py::test_the_development_pages_line_runs_a_module_on_apache_kafka",
    ("docs/deploying.md", ".venv/bin/safepoint broker --kafka"):
        "tests/integration/test_broker_command.py::test_the_deployment_pages_kafka_brokers_start_answer_and_stop",
    ("docs/security.md", ".venv/bin/safepoint directive-key"):
        "tests/unit/test_signed_directives.py::test_the_security_pages_key_pair_signs_what_nodes_verify",
    ("docs/security.md", ".venv/bin/safepoint acls"): "tests/unit/test_acls.py::test_the_pages_acls_line_prints_a_nodes_grants",
    ("docs/security.md", "[kafka]"):
        "tests/unit/test_plan_and_settings.py::test_the_security_pages_kafka_table_is_settings_whose_secrets_hide",
    ("docs/operations.md", "scrape_configs:"):
        "tests/integration/test_status_http.py::test_the_job_serves_what_pins_history",
}
