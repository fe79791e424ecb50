"""A transform run's driver JVM flags follow the planned record count (issue 25): few
records, the client compiler alone (C2's compiler threads cost a run more than they save);
many, C1+C2 and the huge generated methods compiled."""

from __future__ import annotations

from pipeline.spark.session import JVM_FLAGS, SMALL_SQL_RECORDS, spark_conf, sql_flags


def test_a_small_transform_run_starts_its_jvm_with_the_client_compiler_alone():
    assert sql_flags(0) == sql_flags(SMALL_SQL_RECORDS) == "sql_small"
    assert "-XX:TieredStopAtLevel=1" in JVM_FLAGS["sql_small"]


def test_a_big_transform_run_keeps_c2():
    assert sql_flags(SMALL_SQL_RECORDS + 1) == "sql"
    assert "TieredStopAtLevel" not in JVM_FLAGS["sql"]
    assert "-XX:-DontCompileHugeMethods" in JVM_FLAGS["sql"]


def test_the_chosen_flags_reach_the_driver_jvm_unless_the_user_set_their_own():
    flags = spark_conf("local[2]", {}, jvm=sql_flags(1000)).get("spark.driver.extraJavaOptions")
    assert flags == JVM_FLAGS["sql_small"]
    mine = {"spark.driver.extraJavaOptions": "-Xmx1g"}
    assert spark_conf("local[2]", mine, jvm="sql_small").get(
        "spark.driver.extraJavaOptions") == "-Xmx1g"
