#!/usr/bin/env bash
# Apache Kafka (KRaft) and Spark's Kafka connector from Maven Central, into .jars/ (git ignores it):
# the tests run real Kafka from those jars and Spark's own Kafka source beside the Python one, and the
# images (scripts/images.sh) copy them (scripts/jars/*/pom.xml pin them). A second run checks a stamp
# and does nothing. Exit 1 when a set could not be installed (said on stderr, with what to do).
set -euo pipefail
cd "$(dirname "$0")/.."

install_jars() {
  local name="$1" pom="scripts/jars/$1/pom.xml" dest=".jars/$1"
  local want
  want=$(sha256sum "$pom" | cut -c1-16)
  if [ -f "$dest/.pom-sha" ] && [ "$(cat "$dest/.pom-sha")" = "$want" ]; then
    return 0
  fi
  if ! command -v mvn >/dev/null 2>&1; then
    echo "jars: Maven (mvn) not found: $name is not installed; the tests that run it fail in CI (apt-get install maven)" >&2
    return 1
  fi
  rm -rf "$dest"
  if ! mvn -q -B -Dstyle.color=never -f "$pom" package >".jars-$name.log" 2>&1; then
    echo "jars: could not fetch $name from Maven Central (see .jars-$name.log); without it the tests that run" >&2
    echo "      Apache Kafka or Spark's Kafka connector fail in CI: check that this machine reaches repo.maven.apache.org" >&2
    rm -rf "$dest"
    return 1
  fi
  rm -f ".jars-$name.log"
  echo "$want" >"$dest/.pom-sha"
  echo "jars: installed $name ($(ls "$dest" | grep -c '\.jar$') jars in $dest)"
}

mkdir -p .jars
rc=0
for name in "${@:-kafka spark-kafka}"; do
  for one in $name; do
    install_jars "$one" || rc=1
  done
done
exit "$rc"
