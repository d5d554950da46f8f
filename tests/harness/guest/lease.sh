#!/bin/sh
case "$1" in
  deconfig)
    ip addr flush dev "$interface"
    ip link set "$interface" up
    ;;
  bound|renew)
    prefix=$(ipcalc -p "$ip" "$subnet" | cut -d= -f2)
    ip addr flush dev "$interface"
    ip addr add "$ip/$prefix" dev "$interface"
    [ -n "$mtu" ] && ip link set "$interface" mtu "$mtu"
    if [ -n "$staticroutes" ]; then
      set -- $staticroutes
      while [ $# -ge 2 ]; do
        if [ "$1" = 0.0.0.0/0 ]; then ip route replace default via "$2" dev "$interface" onlink
        else ip route replace "$1" via "$2" dev "$interface" onlink; fi
        shift 2
      done
    elif [ -n "$router" ]; then
      for gw in $router; do ip route replace default via "$gw" dev "$interface" onlink; break; done
    fi
    : >/etc/resolv.conf
    [ -n "$search" ] && echo "search $search" >>/etc/resolv.conf
    for server in $dns; do echo "nameserver $server" >>/etc/resolv.conf; done
    [ -n "$hostname" ] && hostname "$hostname"
    {
      echo "interface=$interface"
      echo "ip=$ip"
      echo "prefix=$prefix"
      echo "router=$router"
      echo "dns=$dns"
      echo "domain=$domain"
      echo "search=$search"
      echo "hostname=$hostname"
      echo "mtu=$mtu"
      echo "staticroutes=$staticroutes"
      echo "lease=$lease"
      echo "serverid=$serverid"
      echo "mac=$(cat /sys/class/net/$interface/address)"
      echo "linkmtu=$(cat /sys/class/net/$interface/mtu)"
    } >/www/dhcp
    echo "virtnode-guest: ready ip=$ip"
    ;;
esac
exit 0
