"""Each Spark line (3.5, 4.0) has its own connector jars: the job picks the running pyspark's
and refuses another line's with one clear line, before Spark fails on a linkage error."""

from __future__ import annotations

import pyspark
import pytest

from pipeline.errors import ConfigError
from pipeline.spark.session import (
    check_connector,
    connector_coordinate,
    connector_jar_name,
    connector_jars,
    default_jar_dir,
)


def test_the_connector_is_scala_2_13_from_spark_4_and_2_12_on_3_5():
    assert connector_jar_name("4.0.0") == "spark-sql-kafka-0-10_2.13-4.0.0.jar"
    assert connector_jar_name("3.5.7") == "spark-sql-kafka-0-10_2.12-3.5.7.jar"


def test_the_coordinate_names_the_running_pyspark():
    scala = "2.13" if pyspark.__version__.startswith("4") else "2.12"
    assert connector_coordinate() == (
        f"org.apache.spark:spark-sql-kafka-0-10_{scala}:{pyspark.__version__}")


def test_each_line_has_its_own_jar_folder():
    assert default_jar_dir("3.5.7").name == "spark-3.5"
    assert default_jar_dir("4.0.0").name == "spark-4.0"


def test_another_lines_connector_is_refused_naming_both_versions(tmp_path):
    jars = [str(tmp_path / "spark-sql-kafka-0-10_2.13-4.0.0.jar"),
            str(tmp_path / "kafka-clients-3.9.0.jar")]
    with pytest.raises(ConfigError) as e:
        check_connector(str(tmp_path), jars, "3.5.7")
    assert "spark-sql-kafka-0-10_2.13-4.0.0.jar" in e.value.message
    assert "pyspark 3.5.7 (spark-sql-kafka-0-10_2.12-3.5.7.jar)" in e.value.message


def test_the_matching_connector_is_accepted(tmp_path):
    jars = [str(tmp_path / "spark-sql-kafka-0-10_2.12-3.5.7.jar")]
    check_connector(str(tmp_path), jars, "3.5.7")


def test_a_jars_dir_of_another_line_fails_the_lookup(tmp_path, monkeypatch):
    other = "3.5.7" if pyspark.__version__.startswith("4") else "4.0.0"
    (tmp_path / connector_jar_name(other)).write_bytes(b"")
    monkeypatch.setenv("PIPELINE_JARS_DIR", str(tmp_path))
    with pytest.raises(ConfigError, match=f"is not the one of this pyspark {pyspark.__version__}"):
        connector_jars()


def test_a_jars_dir_of_this_line_is_used(tmp_path, monkeypatch):
    (tmp_path / connector_jar_name(pyspark.__version__)).write_bytes(b"")
    (tmp_path / "commons-pool2-2.12.0.jar").write_bytes(b"")
    monkeypatch.setenv("PIPELINE_JARS_DIR", str(tmp_path))
    assert [p.rsplit("/", 1)[1] for p in connector_jars()] == [
        "commons-pool2-2.12.0.jar", connector_jar_name(pyspark.__version__)]
