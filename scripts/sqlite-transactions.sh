#!/usr/bin/env bash
# Prints the SQL of the lab's `sqlite` workload: a table, then 100 transactions of 100 rows.
# Used by mount-bulk.sh and mount-sqlite-rounds.sh (`sqlite3 DB < sql`).
echo 'CREATE TABLE t (id INTEGER PRIMARY KEY, v TEXT);'
for ((t = 0; t < 100; t++)); do
  echo 'BEGIN;'
  for ((i = 0; i < 100; i++)); do echo "INSERT INTO t (v) VALUES ('$(((t * 100 + i) * 7919 % 1000000))');"; done
  echo 'COMMIT;'
done
