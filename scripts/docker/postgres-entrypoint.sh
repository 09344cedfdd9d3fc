#!/bin/sh
# The entrypoint of the postgres:15 image that scripts/docker-images.sh builds
# from Debian's postgresql-15. It does what the official image's entrypoint
# does for the settings that tests/dockerpass uses, and no more:
#
#   POSTGRES_HOST_AUTH_METHOD  the pg_hba.conf method of every host (TCP)
#                              connection, such as trust; required, as this
#                              image knows no POSTGRES_PASSWORD
#   POSTGRES_DB                a database made at the first start (default:
#                              postgres, which initdb makes)
#   PGPORT                     the port the server listens on (default 5432),
#                              read by postgres itself
#   PGDATA                     the data directory (/var/lib/postgresql/data)
#
# Arguments that start with "-" are passed on to postgres; "postgres ARGS"
# runs the server with ARGS; anything else is run as a command. The server
# runs as the user postgres, on a cluster that initdb makes at the first
# start, and listens on all addresses unless told otherwise
# (-c listen_addresses=...).
set -eu

case "${1:-postgres}" in -*) set -- postgres "$@" ;; esac
[ "${1:-postgres}" = postgres ] || exec "$@"
[ $# -gt 0 ] && shift

: "${PGDATA:=/var/lib/postgresql/data}"
export PGDATA

if [ "$(id -u)" = 0 ]; then
	install -d -o postgres -g postgres -m 0700 "$PGDATA"
	install -d -o postgres -g postgres -m 2775 /var/run/postgresql
	exec setpriv --reuid=postgres --regid=postgres --init-groups "$0" postgres "$@"
fi

if [ ! -s "$PGDATA/PG_VERSION" ]; then
	if [ -n "${POSTGRES_PASSWORD:-}" ]; then
		echo "error: this image knows no POSTGRES_PASSWORD; set POSTGRES_HOST_AUTH_METHOD (such as trust)" >&2
		exit 1
	fi
	if [ -z "${POSTGRES_HOST_AUTH_METHOD:-}" ]; then
		echo "error: POSTGRES_HOST_AUTH_METHOD is not set (this image knows no POSTGRES_PASSWORD)" >&2
		exit 1
	fi
	initdb --username=postgres --encoding=UTF8 --locale=C.UTF-8 --no-sync \
		--auth-local=trust --auth-host="$POSTGRES_HOST_AUTH_METHOD" >/dev/null
	printf 'host all all all %s\n' "$POSTGRES_HOST_AUTH_METHOD" >>"$PGDATA/pg_hba.conf"
	printf "listen_addresses = '*'\n" >>"$PGDATA/postgresql.conf"
	db=${POSTGRES_DB:-postgres}
	if [ "$db" != postgres ]; then
		# Single-user mode: no server listens until the final one below, so
		# that a client that can connect finds the database made.
		printf 'CREATE DATABASE "%s";\n' "$(printf %s "$db" | sed 's/"/""/g')" |
			postgres --single -j -D "$PGDATA" postgres >/dev/null
	fi
	echo "PostgreSQL init process complete; ready for start up."
fi

exec postgres "$@"
