#!/bin/sh
# The entrypoint of the mariadb:10.11 image that scripts/docker-images.sh
# builds from Debian's mariadb-server. It does what the official image's
# entrypoint does for the settings that tests/dockerpass uses, and no more:
#
#   MARIADB_ALLOW_EMPTY_ROOT_PASSWORD  root may log in with an empty password,
#                                      from any host (root@'%'), over TCP too;
#                                      required, as this image knows no
#                                      MARIADB_ROOT_PASSWORD
#   MARIADB_DATABASE                   a database made at the first start
#
# Arguments that start with "-" are passed on to mariadbd (such as
# --port=13306); "mariadbd ARGS" runs the server with ARGS; anything else is
# run as a command. The server runs as the user mysql, on a data directory
# that mariadb-install-db makes at the first start. Debian's configuration
# binds it to 127.0.0.1 unless told otherwise (--bind-address=...).
set -eu

case "${1:-mariadbd}" in -*) set -- mariadbd "$@" ;; esac
case "${1:-mariadbd}" in mariadbd | mysqld) ;; *) exec "$@" ;; esac
[ $# -gt 0 ] && shift

datadir=/var/lib/mysql
install -d -o mysql -g mysql -m 0755 /run/mysqld
install -d -o mysql -g mysql -m 0700 "$datadir"

if [ ! -d "$datadir/mysql" ]; then
	case "${MARIADB_ALLOW_EMPTY_ROOT_PASSWORD:-}" in
	"" | 0 | no | false)
		echo "error: MARIADB_ALLOW_EMPTY_ROOT_PASSWORD is not set (this image knows no MARIADB_ROOT_PASSWORD)" >&2
		exit 1
		;;
	esac
	# Debian's root@localhost logs in through the socket only; like the
	# official image, let root in with an empty password, over TCP too:
	# root@localhost by --auth-root-authentication-method=normal, and
	# root@'%' from any address. mariadb-install-db runs this file in
	# bootstrap mode, which reads no grant tables until FLUSH PRIVILEGES.
	sql=$(mktemp)
	{
		echo "FLUSH PRIVILEGES;"
		echo "CREATE USER 'root'@'%' IDENTIFIED VIA mysql_native_password USING PASSWORD('');"
		echo "GRANT ALL PRIVILEGES ON *.* TO 'root'@'%' WITH GRANT OPTION;"
		if [ -n "${MARIADB_DATABASE:-}" ]; then
			printf 'CREATE DATABASE IF NOT EXISTS `%s`;\n' "$(printf %s "$MARIADB_DATABASE" | sed 's/`/``/g')"
		fi
	} >"$sql"
	chmod 0644 "$sql"
	mariadb-install-db --user=mysql --datadir="$datadir" --skip-test-db \
		--auth-root-authentication-method=normal --extra-file="$sql" >/dev/null
	rm -f "$sql"
	echo "MariaDB init process done. Ready for start up."
fi

exec mariadbd --user=mysql "$@"
